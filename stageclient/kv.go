package stageclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/omnipd/omnipd/stageapi"
)

// ReleaseKV asks a reference prefill worker to drop the KV it exported, or
// is about to export, under key (POST stageapi.KVReleasePath): the request
// it was for is gone.
func (c *Client) ReleaseKV(ctx context.Context, requestID, key string) error {
	body, err := json.Marshal(map[string]string{"key": key})
	if err != nil {
		return fmt.Errorf("stageclient: encode the KV release: %w", err)
	}
	_, err = c.Post(ctx, stageapi.KVReleasePath, requestID, body)
	return err
}

// ReleaseConditioning asks a Thinker worker to free, unread, the
// conditioning stash it keeps under key (DELETE
// stageapi.ConditioningPath{key}): no Talker will fetch it. A stash already
// gone — fetched, released or expired: the worker answers 404 — is no
// error, since what the call asks for holds.
func (c *Client) ReleaseConditioning(ctx context.Context, key string) error {
	return c.release(ctx, stageapi.ConditioningPath+url.PathEscape(key))
}

// ReleaseEncoderLease ends a request's hold on the encoder outputs an
// encoder worker keeps for it (DELETE stageapi.EncoderLeasePath{lease}). A
// lease already gone — ended by its TTL, or never taken (a vLLM encoder,
// or one that restarted): 404 — is no error.
func (c *Client) ReleaseEncoderLease(ctx context.Context, lease string) error {
	return c.release(ctx, stageapi.EncoderLeasePath+url.PathEscape(lease))
}

// release sends a DELETE of what path names. Success is any 2xx, or a 404
// (nothing left to free); anything else is an error of the package's
// classes.
func (c *Client) release(ctx context.Context, path string) error {
	req, what, err := c.newRequest(ctx, http.MethodDelete, path, "", nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req, nil)
	if err != nil {
		return classifyDo(ctx, what, err)
	}
	defer resp.Body.Close()
	if !is2xx(resp.StatusCode) && resp.StatusCode != http.StatusNotFound {
		return readUpstreamError(what, resp)
	}
	// Read the (tiny) body so the connection is reused.
	if _, err := readBounded(resp.Body, maxErrorBody); err != nil && !errors.Is(err, errTooLarge) {
		return classifyRead(ctx, what, err)
	}
	return nil
}
