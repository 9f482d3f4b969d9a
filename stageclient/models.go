package stageclient

import "context"

// MaxModelLen asks the instance's GET /v1/models for the longest prompt
// plus output, in tokens, it serves: the max_model_len vLLM and the
// reference worker report on their first model. 0 with a nil error means
// the instance does not say.
func (c *Client) MaxModelLen(ctx context.Context) (int, error) {
	var list struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := c.getJSON(ctx, "/v1/models", false, &list); err != nil {
		return 0, err
	}
	if len(list.Data) == 0 {
		return 0, nil
	}
	return list.Data[0].MaxModelLen, nil
}
