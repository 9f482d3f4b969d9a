package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Error types, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	// TypeUpstream marks errors that came from a stage worker rather than
	// from omnipd itself.
	TypeUpstream = "upstream_error"
)

// Error codes omnipd sets. Upstream failures use codes named for the stage
// and the failure (e.g. "prefill_upstream_timeout"), chosen by the caller.
const (
	CodeModelNotFound      = "model_not_found"
	CodeRequestTooLarge    = "request_too_large"
	CodeRateLimitExceeded  = "rate_limit_exceeded"
	CodeInvalidAPIKey      = "invalid_api_key"
	CodeServiceUnavailable = "service_unavailable"
	CodeMethodNotAllowed   = "method_not_allowed"
	CodeRequestTimeout     = "request_timeout"
	// CodeContextLengthExceeded is a request that does not fit the model's
	// context, as OpenAI names it.
	CodeContextLengthExceeded = "context_length_exceeded"
)

// ErrorResponse is OpenAI's error body, {"error": {...}}, with the HTTP status
// it goes out with. It is an error itself, so a client that reads one from a
// worker can return it as is.
type ErrorResponse struct {
	Detail ErrorDetail `json:"error"`
	// Status is the HTTP status code; it is not part of the body.
	Status int `json:"-"`
}

// ErrorDetail is the object under "error". Param and Code are null when unset,
// as OpenAI writes them.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

var _ error = (*ErrorResponse)(nil)

func (e *ErrorResponse) Error() string {
	var b strings.Builder
	if e.Status != 0 {
		b.WriteString(strconv.Itoa(e.Status))
		b.WriteByte(' ')
	}
	b.WriteString(e.Detail.Type)
	if e.Detail.Code != nil {
		b.WriteString(" (" + *e.Detail.Code + ")")
	}
	b.WriteString(": ")
	b.WriteString(e.Detail.Message)
	return b.String()
}

// UnmarshalJSON accepts what vLLM writes as well as what OpenAI writes: vLLM
// sends code as the HTTP status number, so a number is kept as its digits,
// and a bare string is taken as the message.
func (d *ErrorDetail) UnmarshalJSON(b []byte) error {
	if kindOf(b) == "string" {
		*d = ErrorDetail{}
		return json.Unmarshal(b, &d.Message)
	}
	var w struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*d = ErrorDetail{Message: w.Message, Type: w.Type, Param: looseString(w.Param), Code: looseString(w.Code)}
	return nil
}

// looseString reads a string, or any other non-null JSON value as its text.
func looseString(raw json.RawMessage) *string {
	switch kindOf(raw) {
	case "nothing", "null":
		return nil
	case "string":
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return &s
		}
	}
	s := string(bytes.TrimSpace(raw))
	return &s
}

func newError(status int, typ, code, message string) *ErrorResponse {
	e := &ErrorResponse{Status: status, Detail: ErrorDetail{Message: message, Type: typ}}
	if code != "" {
		e.Detail.Code = &code
	}
	return e
}

// InvalidRequest is a 400 about param (empty when no single parameter is at
// fault).
func InvalidRequest(param, message string) *ErrorResponse {
	e := newError(http.StatusBadRequest, TypeInvalidRequest, "", message)
	if param != "" {
		e.Detail.Param = &param
	}
	return e
}

// PromptTooLong is vLLM's 400 for a prompt of tokens input tokens that
// reaches the model's context of maxModelLen tokens, leaving no room for
// one generated token: its message (OpenAIServing._validate_input,
// vllm/entrypoints/openai/serving_engine.py), with OpenAI's code.
func PromptTooLong(param string, maxModelLen, tokens int) *ErrorResponse {
	e := InvalidRequest(param, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
		maxModelLen, tokens))
	code := CodeContextLengthExceeded
	e.Detail.Code = &code
	return e
}

// NotFound is a 404 for a path or object that does not exist.
func NotFound(message string) *ErrorResponse {
	return newError(http.StatusNotFound, TypeNotFound, "", message)
}

// InvalidURL is the 404 OpenAI answers for a path it does not serve:
// message "Invalid URL (POST /v1/nope)", type invalid_request_error, no
// code.
func InvalidURL(method, path string) *ErrorResponse {
	return newError(http.StatusNotFound, TypeInvalidRequest, "", fmt.Sprintf("Invalid URL (%s %s)", method, path))
}

// MethodNotAllowed is a 405 for a path served under other methods; the
// caller sets Allow.
func MethodNotAllowed(message string) *ErrorResponse {
	return newError(http.StatusMethodNotAllowed, TypeInvalidRequest, CodeMethodNotAllowed, message)
}

// ModelNotFound is the 404 OpenAI answers for an unknown model.
func ModelNotFound(model string) *ErrorResponse {
	e := newError(http.StatusNotFound, TypeInvalidRequest, CodeModelNotFound,
		fmt.Sprintf("The model %q does not exist.", model))
	param := "model"
	e.Detail.Param = &param
	return e
}

// RequestTooLarge is a 413 for a body over limit bytes.
func RequestTooLarge(limit int64) *ErrorResponse {
	return newError(http.StatusRequestEntityTooLarge, TypeInvalidRequest, CodeRequestTooLarge,
		fmt.Sprintf("request body exceeds the limit of %d bytes", limit))
}

// Unauthorized is a 401 for a missing or wrong API key. OpenAI answers it
// with type invalid_request_error and code invalid_api_key, and clients key
// on that pair; the caller also sets WWW-Authenticate (see WriteUnauthorized).
func Unauthorized(message string) *ErrorResponse {
	return newError(http.StatusUnauthorized, TypeInvalidRequest, CodeInvalidAPIKey, message)
}

// RateLimited is a 429; clients back off and retry.
func RateLimited(message string) *ErrorResponse {
	return newError(http.StatusTooManyRequests, TypeRateLimit, CodeRateLimitExceeded, message)
}

// InternalError is a 500. The message goes to the client: keep causes for the
// log.
func InternalError(message string) *ErrorResponse {
	return newError(http.StatusInternalServerError, TypeServer, "", message)
}

// Unavailable is a 503: omnipd cannot serve right now (no healthy stage,
// shutting down).
func Unavailable(message string) *ErrorResponse {
	return newError(http.StatusServiceUnavailable, TypeServer, CodeServiceUnavailable, message)
}

// Upstream is an error caused by a stage worker, typically 502 (the worker
// failed or answered nonsense) or 504 (it timed out), with a code naming the
// stage and failure, e.g. Upstream(502, "prefill_upstream_unavailable", ...).
func Upstream(status int, code, message string) *ErrorResponse {
	return newError(status, TypeUpstream, code, message)
}

// WriteError writes e as a JSON response with its status (500 if unset).
func WriteError(w http.ResponseWriter, e *ErrorResponse) error {
	body, err := marshalNoEscape(e)
	if err != nil {
		return err
	}
	status := e.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, err = w.Write(append(body, '\n'))
	return err
}

// ParseErrorResponse reads the error body a worker answered with status. It
// understands OpenAI's {"error": {...}}, vLLM's older flat
// {"object": "error", "message": ...}, FastAPI's {"detail": ...} (unknown
// routes), and anything else as text, so a proxy's HTML page still yields a
// readable message.
func ParseErrorResponse(status int, body []byte) *ErrorResponse {
	e := &ErrorResponse{Status: status}
	var nested struct {
		Error *ErrorDetail `json:"error"`
	}
	if json.Unmarshal(body, &nested) == nil && nested.Error != nil {
		e.Detail = *nested.Error
		return e.defaulted()
	}
	var flat struct {
		Object  string          `json:"object"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &flat) == nil {
		switch {
		case flat.Object == "error" || flat.Message != "":
			if json.Unmarshal(body, &e.Detail) != nil {
				e.Detail = ErrorDetail{Message: flat.Message}
			}
			return e.defaulted()
		case len(flat.Detail) > 0:
			if s := looseString(flat.Detail); s != nil {
				e.Detail.Message = *s
			}
			return e.defaulted()
		}
	}
	const maxText = 512
	text := strings.TrimSpace(string(body))
	if len(text) > maxText {
		text = text[:maxText] + "…"
	}
	e.Detail.Message = text
	return e.defaulted()
}

// StreamError returns the error a worker sent as an SSE event in place of a
// chunk (vLLM does this when generation fails mid-stream), or nil if payload
// is not an error event.
func StreamError(payload []byte) *ErrorResponse {
	if !bytes.Contains(payload, []byte(`"error"`)) {
		return nil // the common case: a chunk; skip the second decode
	}
	var ev struct {
		Error *ErrorDetail `json:"error"`
	}
	if json.Unmarshal(payload, &ev) != nil || ev.Error == nil {
		return nil
	}
	e := &ErrorResponse{Detail: *ev.Error}
	if e.Detail.Code != nil {
		if n, err := strconv.Atoi(*e.Detail.Code); err == nil && n >= 400 && n <= 599 {
			e.Status = n
		}
	}
	return e.defaulted()
}

// defaulted fills an empty type and message from the status, so the error
// still says something when the worker's body did not.
func (e *ErrorResponse) defaulted() *ErrorResponse {
	if e.Detail.Type == "" {
		switch {
		case e.Status >= 500:
			e.Detail.Type = TypeServer
		case e.Status == http.StatusNotFound:
			e.Detail.Type = TypeNotFound
		default:
			e.Detail.Type = TypeInvalidRequest
		}
	}
	if e.Detail.Message == "" && e.Status != 0 {
		e.Detail.Message = http.StatusText(e.Status)
	}
	return e
}
