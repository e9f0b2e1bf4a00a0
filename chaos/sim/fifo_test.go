package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestFIFOCheck feeds fifoAfter the node states and replies of hand-made
// Acquire calls: a free key granted to anyone but the head of the live
// line is a violation; a refresh, an expired entry and a client without
// fairness are not checked against the line.
func TestFIFOCheck(t *testing.T) {
	const now = 1_000_000
	v := lineEntry{id: "V", ticket: 100, deadline: now + 500} // live, ahead
	x := lineEntry{id: "X", ticket: 50, deadline: now + 500}  // live, ahead of V
	grant, queued := []byte(":0\r\n"), []byte(":-1125899906842624\r\n")
	cases := []struct {
		name   string
		ac     acquireCall
		reply  []byte
		ahead  bool
		counts FairStats
	}{
		{"head of the line", acquireCall{fairCall: fairCall{fair: true, id: "V", ticket: 100, join: true, free: true, line: []lineEntry{v}}}, grant, false, FairStats{Grants: 1}},
		{"empty line", acquireCall{fairCall: fairCall{fair: true, id: "W", ticket: 200, join: true, free: true}}, grant, false, FairStats{Grants: 1}},
		{"behind a live entry", acquireCall{fairCall: fairCall{fair: true, id: "W", ticket: 200, join: true, free: true, line: []lineEntry{v}}}, grant, true, FairStats{Grants: 1, Lined: 1, Ahead: 1}},
		{"in line, not the head", acquireCall{fairCall: fairCall{fair: true, id: "V", ticket: 100, join: true, free: true, line: []lineEntry{x, v}}}, grant, true, FairStats{Grants: 1, Lined: 1, Ahead: 1}},
		{"a tie goes by id", acquireCall{fairCall: fairCall{fair: true, id: "W", ticket: 100, join: true, free: true, line: []lineEntry{v}}}, grant, true, FairStats{Grants: 1, Lined: 1, Ahead: 1}},
		{"TryLock with a live line", acquireCall{fairCall: fairCall{fair: true, id: "T.1", ticket: 300, free: true, line: []lineEntry{v}}}, grant, true, FairStats{Grants: 1, Lined: 1, Ahead: 1}},
		{"refused: nothing to check", acquireCall{fairCall: fairCall{fair: true, id: "W", ticket: 200, join: true, free: true, line: []lineEntry{v}}}, queued, false, FairStats{Queued: 1}},
		{"a refresh skips the line", acquireCall{fairCall: fairCall{fair: true, id: "W", ticket: 200, join: true, line: []lineEntry{v}}}, grant, false, FairStats{Refreshes: 1}},
		{"no fairness ignores the line", acquireCall{fairCall: fairCall{id: "", free: true, line: []lineEntry{v}}}, grant, false, FairStats{Unfair: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &World{sc: Scenario{Fair: true}, start: time.Now(), hist: newHistory(time.Now(), false)}
			c.ac.nowMS, c.ac.key, c.ac.token = now, "k0", c.ac.id+".1"
			w.fifoAfter(&Node{id: 2}, &c.ac, c.reply)
			vs := w.checkFIFO()
			assert.Equal(t, c.ahead, len(vs) == 1, "violations: %v", vs)
			assert.Equal(t, c.counts, w.fairStats())
		})
	}
}
