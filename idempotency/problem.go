package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Problem responses: RFC 9457 problem details (application/problem+json),
// their codes, and Retry-After.

// Problem codes (the "code" member of problem responses).
const (
	codeMissingKey        = "missing-key"
	codeNoPrincipal       = "no-principal"
	codeInvalidKey        = "invalid-key"
	codeBodyTooLarge      = "body-too-large"
	codeUnreadableBody    = "unreadable-body"
	codeInProgress        = "in-progress"
	codeKeyReused         = "key-reused"
	codeResultNotRetained = "result-not-retained"
	codeNegotiation       = "negotiation-mismatch"
	codeStoredFailure     = "stored-failure"
	codeStoreUnavailable  = "store-unavailable"
	codeOutcomeUnknown    = "outcome-unknown"
	codeInternal          = "internal"
)

// Retry-After bounds. The Barrier's hint for a request in flight can be as
// long as the record's TTL; a client should look again well before that.
const (
	unavailableRetryAfter = time.Second
	maxRetryAfter         = time.Minute
)

func writeBodyProblem(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, codeBodyTooLarge,
			fmt.Sprintf("a request with an Idempotency-Key may carry at most %d bytes", tooLarge.Limit))
		return
	}
	writeProblem(w, http.StatusBadRequest, codeUnreadableBody, "the request body could not be read")
}

func inProgressRetryAfter(err error) time.Duration {
	var ip *InProgressError
	if errors.As(err, &ip) {
		return ip.RetryAfter
	}
	return time.Second
}

// setRetryAfter sets Retry-After in whole seconds, rounded up, within
// [1 s, maxRetryAfter].
func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	d = min(max(d, time.Second), maxRetryAfter)
	secs := (d + time.Second - 1) / time.Second
	w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
}

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	body, err := json.Marshal(problem{Type: "about:blank", Title: statusPhrase(status), Status: status, Detail: detail, Code: code})
	if err != nil { // cannot happen: every field is a string or an int
		body = []byte(`{"type":"about:blank"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// statusPhrase is the RFC 9110 phrase, where Go still has the older one.
func statusPhrase(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return "Content Too Large"
	case http.StatusUnprocessableEntity:
		return "Unprocessable Content"
	}
	return http.StatusText(status)
}
