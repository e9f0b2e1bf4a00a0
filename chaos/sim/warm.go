package sim

import (
	"maps"
	"sort"
	"sync"

	lua "github.com/yuin/gopher-lua"

	"github.com/redlease/redlease/internal/script"
)

// A warm node starts its first process with the library's lock scripts
// already in its script cache, as a production server has them once any
// client of the library ran them there: the library's EVALSHA then runs
// at once, where a cold node answers NOSCRIPT and the library sends the
// source again (EVAL; in a batch, the pipeline's NOSCRIPT path). Each node
// of a generated run is drawn warm with probability warmShare, from the
// seed, independently: most runs mix warm and cold nodes, so the NOSCRIPT
// paths stay in nearly every multi-node run. A restarted process is always
// cold (Redis keeps no script cache across a restart), and so is every
// node of a hand-written world (findings_test, the tests that build a
// World themselves), whose orders were written against cold nodes.
//
// Why: a run with every node cold explores the first use of a server
// more than production meets it, and pays for it: each NOSCRIPT is a
// round trip plus an EVAL carrying the script's source (about one command
// in ten of watchdog-mixed's). Warm nodes save a few per cent of the CPU
// per seed (docs/simulator.md, Speed). The idempotency scripts are not
// preloaded: the idempotency rotation keeps every node cold for them.
const warmShare = 0.75

// warmSalt separates the warm draw from the seed's other draws.
const warmSalt = 0x3a4d5c

// libraryScripts are the scripts a warm node has cached: the lock
// strategies' own (internal/script).
var libraryScripts = []*script.Script{
	script.Acquire, script.RaiseFence, script.Extend, script.Release,
	script.Leave, script.Identify, script.ExtendMany,
}

// warm reports whether node id of w starts warm: only in a generated run
// (w.warmDraw), drawn from the seed.
func (w *World) warm(id int) bool {
	return w.warmDraw && unit(mix(mix(w.seed, warmSalt), uint64(id))) < warmShare
}

// warmNodes lists the nodes of w that started warm, for a replay's log.
func (w *World) warmNodes() []int {
	var ids []int
	for _, n := range w.nodes {
		if n.sent == nil && w.warm(n.id) {
			ids = append(ids, n.id)
		}
	}
	sort.Ints(ids)
	return ids
}

// warmCache is libraryScripts compiled, by SHA: made once per process,
// copied into each warm node's cache.
var warmCache = sync.OnceValue(func() map[string]*lua.FunctionProto {
	m := make(map[string]*lua.FunctionProto, len(libraryScripts))
	for _, s := range libraryScripts {
		p, err := compileScript(s.Source())
		if err != nil {
			panic("sim: a library script does not compile: " + err.Error())
		}
		m[sha1hex(s.Source())] = p
	}
	return m
})

// loadLibraryScripts puts libraryScripts in n's script cache.
func (n *Node) loadLibraryScripts() { maps.Copy(n.scripts, warmCache()) }
