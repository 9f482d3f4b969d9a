package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/omnipd/omnipd/openai"
)

// detokenize is vLLM's POST /detokenize: {"model", "tokens"} in, {"prompt"}
// out, the ids' text as the tokenizer decodes them (DetokenizeRequest and
// DetokenizeResponse in vllm/entrypoints/serve/tokenize/protocol.py at
// 030ea52e; OpenAIServingTokenization.create_detokenize in
// vllm/entrypoints/serve/tokenize/serving.py at cf34c18c). The body is read
// as it streams and the ids checked one by one, so that no more than
// --max-model-len of them are ever held, as /tokenize counts no more.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) error {
	model, ids, err := s.readDetokenize(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		return err
	}
	if model != "" && model != s.cfg.ModelName {
		return openai.ModelNotFound(model)
	}
	writeJSON(w, http.StatusOK, struct {
		Prompt string `json:"prompt"`
	}{s.eng.Tokenizer().Decode(ids)})
	return nil
}

// readDetokenize reads a DetokenizeRequest: the model it names (empty for
// none) and its token ids. Members vLLM does not model are skipped, as its
// request models ignore extra fields.
func (s *Server) readDetokenize(body io.Reader) (model string, ids []int, err error) {
	dec := json.NewDecoder(body)
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil {
		return "", nil, s.bodyError(err)
	} else if tok != json.Delim('{') {
		return "", nil, openai.InvalidRequest("", "expected a JSON object")
	}
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", nil, s.bodyError(err)
		}
		switch key, _ := tok.(string); key {
		case "model":
			var m *string
			if err := dec.Decode(&m); err != nil {
				var typeErr *json.UnmarshalTypeError
				if errors.As(err, &typeErr) {
					return "", nil, openai.InvalidRequest("model", "expected a string")
				}
				return "", nil, s.bodyError(err)
			}
			model = ""
			if m != nil {
				model = *m
			}
		case "tokens":
			// Of a repeated key the last counts, as when decoding whole.
			seen = true
			if ids, err = s.readTokenIDs(dec); err != nil {
				return "", nil, err
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", nil, s.bodyError(err)
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return "", nil, s.bodyError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			err = errors.New("data after the object")
		}
		return "", nil, s.bodyError(err)
	}
	if !seen {
		return "", nil, openai.InvalidRequest("tokens", "tokens is required: a list of token ids")
	}
	return model, ids, nil
}

// readTokenIDs reads the list of ids dec is at. Every id must be a token of
// the vocabulary — the model's or the tokenizer's, whichever is larger, the
// bound vLLM checks a prompt's ids against ("Token id … is out of
// vocabulary", InputProcessor._validate_model_input in
// vllm/v1/engine/input_processor.py at 009daaee). vLLM's /detokenize
// itself refuses ids outside 0..2^63-1 and hands the rest to the Hugging
// Face tokenizer, which drops ids it has no token for; the reference worker
// refuses them all the same way, naming the id, rather than answer text
// with holes in it.
func (s *Server) readTokenIDs(dec *json.Decoder) ([]int, error) {
	if tok, err := dec.Token(); err != nil {
		return nil, s.bodyError(err)
	} else if tok != json.Delim('[') {
		return nil, openai.InvalidRequest("tokens", "want a list of token ids")
	}
	vocab := max(s.eng.Tokenizer().VocabSize(), s.eng.Model().Config.VocabSize)
	ids := []int{}
	for i := 0; dec.More(); i++ {
		tok, err := dec.Token()
		if err != nil {
			return nil, s.bodyError(err)
		}
		n, ok := tok.(json.Number)
		if !ok {
			return nil, openai.InvalidRequest(fmt.Sprintf("tokens[%d]", i), "want an integer token id")
		}
		id, err := strconv.ParseInt(string(n), 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange), err == nil && (id < 0 || id >= int64(vocab)):
			return nil, openai.InvalidRequest("tokens", fmt.Sprintf("Token id %s is out of vocabulary", n))
		case err != nil:
			return nil, openai.InvalidRequest(fmt.Sprintf("tokens[%d]", i), fmt.Sprintf("%s is no integer; want an integer token id", n))
		case i >= s.cfg.MaxModelLen:
			return nil, s.tooLong("tokens", "at least "+strconv.Itoa(i+1))
		}
		ids = append(ids, int(id))
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, s.bodyError(err)
	}
	return ids, nil
}

// bodyError is the answer to a body that could not be read as JSON: a 413
// for one over the body cap, else a 400.
func (s *Server) bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return openai.RequestTooLarge(s.cfg.MaxBodyBytes)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return openai.InvalidRequest("", "invalid JSON: "+err.Error())
}
