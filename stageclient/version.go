package stageclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// Version asks the instance's GET /version for its release, as vllm serve
// reports it ({"version": "0.21.0"}). The connectors' behaviour when a
// request ends without using its KV changes between vLLM releases, so the
// orchestrator picks what to do by it. "" with a nil error means the
// instance does not say: a reference worker, or a proxy that does not pass
// /version on, answers 404.
func (c *Client) Version(ctx context.Context) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	if err := c.getJSON(ctx, "/version", true, &v); err != nil {
		return "", err
	}
	return v.Version, nil
}

// getJSON GETs path and decodes its 200 answer, a small JSON document, into
// v. With missingOK a 404 is no error and leaves v as it was: the instance
// does not have the endpoint.
func (c *Client) getJSON(ctx context.Context, path string, missingOK bool, v any) error {
	resp, what, err := c.get(ctx, path, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if missingOK && resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		return readUpstreamError(what, resp)
	}
	data, err := readBounded(resp.Body, maxErrorBody)
	switch {
	case errors.Is(err, errTooLarge):
		return classified(what, ErrProtocol, err)
	case err != nil:
		return classifyRead(ctx, what, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return classified(what, ErrProtocol, err)
	}
	return nil
}
