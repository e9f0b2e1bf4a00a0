package sim

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHTTPReplayVary: http-replay's Vary checks fail a replay negotiated
// for another value of the Vary field, and a negotiation-mismatch answer
// that is unmarked, on a key that negotiates nothing, or to a request
// whose value every recorded run of the key had; they pass the answers
// the Middleware gives, and count what they examined.
func TestHTTPReplayVary(t *testing.T) {
	const mismatch = `{"type":"about:blank","title":"Conflict","status":409,"code":"negotiation-mismatch"}`
	lang := func(v string) map[string]string { return map[string]string{"Accept-Language": v, "Accept": ""} }
	bodies := map[string]httpAnswer{
		"c0#0.0 h0 201 fence=1 lang=de": {key: "h0", status: http.StatusCreated, vary: "Accept-Language", value: "de"},
		"c1#0.0 h0 503 fence=2 lang=en": {key: "h0", status: http.StatusServiceUnavailable, vary: "Accept-Language", value: "en"},
		"c0#1.0 h3 201 fence=1 lang=en": {key: "h3", status: http.StatusCreated, vary: "Accept-Language", value: "en"},
		"c0#2.0 h2 201 fence=1":         {key: "h2", status: http.StatusCreated},
	}
	for _, tc := range []struct {
		name        string
		rec         httpRunRec
		fail        bool
		vary, diffr int
	}{
		{"replay to the same value", httpRunRec{key: "h0", vary: "Accept-Language", fields: lang("de"), status: 201, body: "c0#0.0 h0 201 fence=1 lang=de", replayed: true}, false, 1, 0},
		{"replay to another value", httpRunRec{key: "h0", vary: "Accept-Language", fields: lang("en"), status: 201, body: "c0#0.0 h0 201 fence=1 lang=de", replayed: true}, true, 1, 1},
		{"replay to an absent field", httpRunRec{key: "h0", vary: "Accept-Language", fields: lang(""), status: 201, body: "c0#0.0 h0 201 fence=1 lang=de", replayed: true}, true, 1, 1},
		{"replay of a key that negotiates nothing", httpRunRec{key: "h2", fields: lang("en"), status: 201, body: "c0#2.0 h2 201 fence=1", replayed: true}, false, 0, 0},
		{"mismatch to another value", httpRunRec{key: "h0", vary: "Accept-Language", fields: lang("en"), status: 409, body: mismatch, replayed: true}, false, 1, 1},
		// Only the 503 run had "en"; the 201 run had "de".
		{"mismatch to the recorded value", httpRunRec{key: "h0", vary: "Accept-Language", fields: lang("de"), status: 409, body: mismatch, replayed: true}, true, 1, 1},
		{"mismatch with no recorded run of the key", httpRunRec{key: "h1", vary: "Accept-Language", fields: lang("de"), status: 409, body: mismatch, replayed: true}, true, 1, 1},
		{"mismatch on a key that negotiates nothing", httpRunRec{key: "h2", fields: lang("de"), status: 409, body: mismatch, replayed: true}, true, 0, 0},
		{"mismatch unmarked", httpRunRec{key: "h3", vary: "Accept-Language", fields: lang("de"), status: 409, body: mismatch}, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &World{hist: &history{}}
			w.idem.httpBodies = bodies
			rec := tc.rec
			w.idem.http = []*httpRunRec{&rec}
			vs := w.checkHTTPLocked()
			if tc.fail {
				require.Len(t, vs, 1)
				assert.Equal(t, InvHTTPReplay, vs[0].Inv)
			} else {
				assert.Empty(t, vs)
			}
			assert.Equal(t, tc.vary, w.hist.ex.n[ExHTTPVary], "examined")
			assert.Equal(t, tc.diffr, w.hist.ex.n[ExHTTPVaryDiffer], "examined with a differing value")
		})
	}
}
