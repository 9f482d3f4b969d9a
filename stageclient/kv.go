package stageclient

import (
	"context"
	"encoding/json"
	"fmt"
)

// KVReleasePath is where a reference Thinker worker that exports KV takes
// the release of one request's lease: POST {"key": "<lease key>"} with the
// deployment secret, answered 204 whether or not the key was leased. A key
// not exported yet is remembered for one lease, so that its export, when
// the prefill finishes, is dropped instead of leased. vLLM has no such
// endpoint; see docs/reliability.md.
const KVReleasePath = "/v1/omnipd/kv/release"

// ReleaseKV asks a reference prefill worker to drop the KV it exported, or
// is about to export, under key: the request it was for is gone.
func (c *Client) ReleaseKV(ctx context.Context, requestID, key string) error {
	body, err := json.Marshal(map[string]string{"key": key})
	if err != nil {
		return fmt.Errorf("stageclient: encode the KV release: %w", err)
	}
	_, err = c.Post(ctx, KVReleasePath, requestID, body)
	return err
}
