package openai

// The model list and version endpoints, in vLLM's shapes.

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"` // "list"
	Data   []ModelCard `json:"data"`
}

// ModelCard is one served model as vLLM describes it (ModelCard in
// vllm/entrypoints/openai/protocol.py, filled by
// OpenAIServingModels.show_available_models in serving_models.py at
// 075e9ba8): OpenAI's id, object, created and owned_by, and vLLM's root
// (what the model was loaded from), parent (the base model of an adapter,
// null for a base model), max_model_len (null when unknown) and one
// permission.
type ModelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"` // "model"
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        *string           `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []ModelPermission `json:"permission"`
}

// ModelPermission is vLLM's ModelPermission with the values vLLM gives
// every served model: sampling, logprobs and viewing allowed, nothing
// else, for any organization.
type ModelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"` // "model_permission"
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// NewModelPermission is the permission vLLM lists for a served model,
// created at created (unix seconds) with a fresh id, as vLLM makes one per
// listing.
func NewModelPermission(created int64) ModelPermission {
	return ModelPermission{
		ID: NewID("modelperm-"), Object: "model_permission", Created: created,
		AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
	}
}

// VersionResponse is the body of GET /version: {"version": "..."}, as vLLM's
// api_server answers it with its own version.
type VersionResponse struct {
	Version string `json:"version"`
}
