package orchestrator

import (
	"errors"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/stageclient"
)

// What the public server needs to tell apart in the errors a request
// returns (Do, and a streamed Result's Next) beside *Error, so that it
// knows nothing of how stages are called.

// ErrCanceled marks a request that ended because it was cancelled, not
// because anything failed: a stage call's context was cancelled (the
// client went away) or its stream was closed. It is the stage client's own
// class, so errors.Is finds it in whatever a stage call returned.
var ErrCanceled = stageclient.ErrCanceled

// StageErrorBody is the error body a stage itself reported — a non-2xx
// answer, or an error event in place of a chunk of its stream — when err
// carries one, else nil. A stream that fails after it began relays it to
// the client as its last event.
func StageErrorBody(err error) *openai.ErrorResponse {
	var ue *stageclient.UpstreamError
	if errors.As(err, &ue) {
		return ue.Body
	}
	return nil
}
