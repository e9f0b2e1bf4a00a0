package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/script"
)

// wire renders a command line as the node receives it.
func wire(line []any) []string {
	out := make([]string, len(line))
	for i, a := range line {
		out[i] = fmt.Sprint(a)
	}
	return out
}

// TestScriptLineLayouts reads tokens out of command lines built by the
// library's own builders, in their EVALSHA and EVAL forms, with and
// without fair mode's arguments: the simulator's readers follow each
// script's declared key count, so a key added to a script cannot shift
// them onto a key (noteGrant read Acquire's KEYS[4] as its token).
func TestScriptLineLayouts(t *testing.T) {
	acq := script.Acquire.Args("k", "redlease:fence:{k}", "k", "k", "tok.1", int64(100), script.IncrFence,
		script.RuleOff, script.NotDurable, script.NoFenceTTL)
	fair := script.AppendPlace(script.Acquire.Args("k", "redlease:fence:{k}", "k", script.QueueKey("k"), "tok.2", int64(100), script.IncrFence,
		script.RuleOff, script.NotDurable, script.NoFenceTTL), redlease.Place{ID: "tok", Ticket: time.UnixMilli(1), Join: true, Lifetime: time.Second})
	for name, c := range map[string]struct {
		line []any
		tok  string
	}{
		"acquire": {acq, "tok.1"}, "acquire eval": {script.Acquire.Eval(acq), "tok.1"},
		"acquire fair": {fair, "tok.2"}, "acquire fair eval": {script.Acquire.Eval(fair), "tok.2"},
	} {
		t.Run(name, func(t *testing.T) {
			sha, keys, argv, ok := scriptLine(wire(c.line))
			require.True(t, ok)
			assert.Equal(t, script.Acquire.Hash(), sha)
			assert.Len(t, keys, 4)
			require.NotEmpty(t, argv)
			assert.Equal(t, c.tok, argv[0])

			w := &World{grants: map[string]grantRec{}, start: time.Now()}
			w.noteGrant(&Node{id: fPrimary}, wire(c.line), []byte(":7\r\n"))
			require.Contains(t, w.grants, c.tok)
			assert.Equal(t, fPrimary, w.grants[c.tok].node)
			w.noteGrant(&Node{id: fReplica}, wire(c.line), []byte(":-5\r\n")) // a refusal grants nothing
			assert.Len(t, w.grants, 1)
			assert.Equal(t, fPrimary, w.grants[c.tok].node)
		})
	}

	ext := script.Extend.Args("k", "tok.1", int64(100))
	for _, line := range [][]any{ext, script.Extend.Eval(ext)} {
		keys, toks := renewalItems(wire(line))
		assert.Equal(t, []string{"k"}, keys)
		assert.Equal(t, []string{"tok.1"}, toks)
	}
	many := script.ExtendMany.LineMany([]any{"a", "b"}, []any{"ta.1", int64(100), "tb.1", int64(200)})
	for _, line := range [][]any{many, script.ExtendMany.Eval(many)} {
		keys, toks := renewalItems(wire(line))
		assert.Equal(t, []string{"a", "b"}, keys)
		assert.Equal(t, []string{"ta.1", "tb.1"}, toks)
	}
	keys, toks := renewalItems(wire(script.ReleaseArgs("k", "tok.1")))
	assert.Nil(t, keys)
	assert.Nil(t, toks)

	_, _, _, ok := scriptLine([]string{"EVALSHA", script.Acquire.Hash(), "9", "k"})
	assert.False(t, ok, "numkeys beyond the line")
	_, _, _, ok = scriptLine([]string{"GET", "k", "x"})
	assert.False(t, ok)
}
