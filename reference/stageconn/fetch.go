package stageconn

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/omnipd/omnipd/stageapi"
)

// Fetch takes a stash from the worker at baseURL: the worker frees it once
// sent.
func Fetch(ctx context.Context, client *http.Client, baseURL, key, secret string) (*stageapi.Conditioning, error) {
	body, err := call(ctx, client, http.MethodGet, baseURL, key, secret)
	if err != nil {
		return nil, err
	}
	return decode(body)
}

// decode reads a fetched body, its refusal named as this data path's like
// every other failure of a fetch.
func decode(body []byte) (*stageapi.Conditioning, error) {
	st, err := stageapi.DecodeConditioning(body)
	if err != nil {
		return nil, fmt.Errorf("stageconn: %w", err)
	}
	return st, nil
}

// Release drops a stash that will not be fetched (the request failed or
// was cancelled), rather than leaving it to the TTL.
func Release(ctx context.Context, client *http.Client, baseURL, key, secret string) error {
	_, err := call(ctx, client, http.MethodDelete, baseURL, key, secret)
	return err
}

func call(ctx context.Context, client *http.Client, method, baseURL, key, secret string) ([]byte, error) {
	body, _, err := callHeader(ctx, client, method, baseURL, url.PathEscape(key), secret)
	return body, err
}

// callHeader does one request on the stash at Path+target (an escaped key,
// perhaps with a query) and returns the body and header of a success.
func callHeader(ctx context.Context, client *http.Client, method, baseURL, target, secret string) ([]byte, http.Header, error) {
	key, _, _ := strings.Cut(target, "?")
	if k, err := url.PathUnescape(key); err == nil {
		key = k
	}
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+stageapi.ConditioningPath+target, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("stageconn: %w", err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("stageconn: %s %s: %w", method, key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4*stageapi.MaxConditioningElements+64))
	if err != nil {
		return nil, nil, fmt.Errorf("stageconn: read %s: %w", key, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, nil, fmt.Errorf("%w: %q at %s", ErrNotFound, key, baseURL)
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, nil, fmt.Errorf("%w at %s", ErrAuth, baseURL)
	case resp.StatusCode >= 300:
		return nil, nil, fmt.Errorf("stageconn: %s %s: HTTP %d: %s", method, key, resp.StatusCode, bytes.TrimSpace(body))
	}
	return body, resp.Header, nil
}
