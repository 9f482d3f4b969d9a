package openai

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// BearerToken returns the token of r's "Authorization: Bearer <token>"
// header, and false when there is none or it uses another scheme. The
// scheme is matched case-insensitively (RFC 9110 §11.1), as vLLM does.
func BearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	return token, token != ""
}

// HasBearer reports whether r carries "Authorization: Bearer <key>". The
// comparison is of SHA-256 digests in constant time, so neither the key's
// bytes nor its length can be learned from how long a refusal takes.
func HasBearer(r *http.Request, key string) bool {
	got, ok := BearerToken(r)
	if !ok {
		return false
	}
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(key))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// WriteUnauthorized answers 401 with OpenAI's invalid_api_key error and
// "WWW-Authenticate: Bearer", which tells a client which credential to send.
// The message must never contain the key or what the client sent.
func WriteUnauthorized(w http.ResponseWriter, message string) error {
	w.Header().Set("WWW-Authenticate", "Bearer")
	return WriteError(w, Unauthorized(message))
}
