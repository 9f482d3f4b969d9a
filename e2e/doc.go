// Package e2e holds omnipd's end-to-end reliability tests: a whole
// deployment built in process (internal/testbed) is driven only through its
// public HTTP API while workers are killed, the KV side channel is cut,
// stages stall and clients leave at every phase; under a sustained mixed
// soak; and with a table of bad requests. Each test checks that every
// request ends with an answer or a clean OpenAI error within its deadline,
// that unrelated requests are unaffected, and that afterwards no KV block,
// lease, conditioning stash, in-flight request or goroutine is left behind.
// docs/reliability.md summarises what they prove.
package e2e
