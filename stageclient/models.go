package stageclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// MaxModelLen asks the instance's GET /v1/models for the longest prompt
// plus output, in tokens, it serves: the max_model_len vLLM and the
// reference worker report on their first model. 0 with a nil error means
// the instance does not say.
func (c *Client) MaxModelLen(ctx context.Context) (int, error) {
	resp, what, err := c.get(ctx, "/v1/models", "application/json")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, readUpstreamError(what, resp)
	}
	data, err := readBounded(resp.Body, maxErrorBody)
	switch {
	case errors.Is(err, errTooLarge):
		return 0, classified(what, ErrProtocol, err)
	case err != nil:
		return 0, classifyRead(ctx, what, err)
	}
	var list struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return 0, classified(what, ErrProtocol, err)
	}
	if len(list.Data) == 0 {
		return 0, nil
	}
	return list.Data[0].MaxModelLen, nil
}
