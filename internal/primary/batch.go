package primary

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/script"
)

// ExtendBatch extends many keys with one ExtendMany script call per
// script.MaxBatch keys, and gives every key its own outcome:
//
//   - The script answers for each key on its own. A key that holds a value
//     of another type (a hash where our string was) cannot hold our token:
//     that key alone gets ErrNotHeld, with the node's WRONGTYPE as its
//     cause (redis.HasErrorPrefix(err, "WRONGTYPE") on the *NodeError's
//     Err). Any other error on one key leaves that key undecided
//     (ErrUnavailable).
//   - A call that fails (NOPERM, a cut connection, a timeout) fails its own
//     keys only, with ErrUnavailable: the other calls' replies stand.
//
// On one primary every call goes out in one pipelined round trip (and one
// WAIT behind them, which covers them all, when replicas are required). On
// a Cluster client keys are grouped by the master that serves their slot,
// one call per script.MaxBatch keys in ExtendMany's local layout (see
// extendShards); each master gets its own pipeline, sent at the same time
// as the others and bounded by its own deadline (see shardDeadline), so a
// master that is down or paused costs its own keys only (ErrUnavailable,
// undecided; the *NodeError names that master) and the others' replies
// come back in time to count.
func (p *Primary) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	out := make([]redlease.Extended, len(items))
	var valid []int
	for i, it := range items {
		if err := p.check(it.Key, it.Token, it.TTL); err != nil {
			out[i].Err = err
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return out
	}
	start := p.cfg.Clock.Now()
	if p.cluster != nil {
		p.extendShards(ctx, items, valid, start, out)
		return out
	}
	calls := chunk(items, valid, nil)
	// Bounded by ctx like every other call (a client without
	// ContextTimeoutEnabled would wait out its read timeout and retries on
	// a lost message, holding the watchdog's call slot): an abandoned
	// batch leaves every item undecided; it may still be applied.
	replies, err := bounded.Call(ctx, p.bound, func(ctx context.Context) ([]reply, error) {
		return p.send(ctx, p.client, calls, p.cfg.Replicas), nil
	}, nil)
	if err != nil {
		replies = make([]reply, len(calls))
		for k := range replies {
			replies[k].err = err
		}
	}
	p.judge(ctx, p.addr, items, calls, replies, start, out)
	return out
}

// batchCall is one ExtendMany call: the items it covers and its command
// line.
type batchCall struct {
	idx  []int
	line []any
}

// reply is what came back for one batchCall.
type reply struct {
	vals []int64 // one per item, when err is nil
	err  error   // the call failed: every item of it is undecided
	repl error   // WAIT fell short for this call (ErrNotReplicated); nil without replicas
}

// chunk appends to calls one ExtendMany call per script.MaxBatch of idx.
func chunk(items []redlease.Extension, idx []int, calls []batchCall) []batchCall {
	for rest := idx; len(rest) > 0; {
		n := min(len(rest), script.MaxBatch)
		keys := make([]any, n)
		args := make([]any, 0, 2*n)
		for j, i := range rest[:n] {
			keys[j] = items[i].Key
			args = append(args, items[i].Token, items[i].TTL.Milliseconds())
		}
		calls = append(calls, batchCall{idx: rest[:n:n], line: script.ExtendMany.LineMany(keys, args)})
		rest = rest[n:]
	}
	return calls
}

// send pipelines calls on c (followed by WAIT for need replicas when need > 0)
// and returns one reply per call. Calls that find the script missing on
// the node (NOSCRIPT: first use, a restart, SCRIPT FLUSH) are sent once
// more as EVAL, which caches it, in a second pipeline with its own WAIT.
func (p *Primary) send(ctx context.Context, c redis.UniversalClient, calls []batchCall, need int) []reply {
	replies := make([]reply, len(calls))
	pending := make([]int, len(calls))
	for k := range pending {
		pending[k] = k
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(pending))
		for n, k := range pending {
			line := calls[k].line
			if attempt > 0 {
				line = script.ExtendMany.Eval(line)
			}
			cmds[n] = pipe.Do(ctx, line...)
		}
		var wait *redis.Cmd
		if need > 0 {
			wait = pipe.Do(ctx, "WAIT", need, p.cfg.WaitTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx) // errors are read per command
		var retry []int
		var repl error
		replChecked := false
		for n, k := range pending {
			vals, err := cmds[n].Int64Slice()
			if attempt == 0 && script.IsNoScript(err) {
				retry = append(retry, k)
				continue
			}
			if err == nil && len(vals) != len(calls[k].idx) {
				err = fmt.Errorf("extend batch: %d replies for %d keys", len(vals), len(calls[k].idx))
			}
			replies[k] = reply{vals: vals, err: err}
			if err == nil && wait != nil {
				if !replChecked {
					repl, replChecked = p.replicatedN(wait, need), true
				}
				replies[k].repl = repl
			}
		}
		pending = retry
	}
	return replies
}

// judge turns the replies of calls into outcomes, item by item. addr names
// the node in causes.
func (p *Primary) judge(ctx context.Context, addr string, items []redlease.Extension, calls []batchCall, replies []reply, start time.Time, out []redlease.Extended) {
	now := p.cfg.Clock.Now()
	for k, c := range calls {
		r := replies[k]
		if r.err != nil {
			p.markSilent(addr, r.err)
			err := failAt(ctx, addr, redlease.ErrUnavailable, r.err) // one error, and one report, per failed call
			for _, i := range c.idx {
				out[i].Err = err
			}
			continue
		}
		for j, i := range c.idx {
			switch v := r.vals[j]; v {
			case resent:
			case script.Extended:
				if r.repl != nil { // extended, but not acknowledged by enough replicas
					out[i].Err = redlease.Wrap(redlease.ErrUnavailable, r.repl)
					continue
				}
				ttl := items[i].TTL
				until := start.Add(ttl - p.DriftAllowance(ttl))
				if !now.Before(until) {
					out[i].Err = fmt.Errorf("%w: no validity left after %v", redlease.ErrNotHeld, now.Sub(start))
					continue
				}
				out[i].Grant = redlease.Grant{Until: until}
			case script.NotOurs:
				out[i].Err = redlease.ErrNotHeld
			case script.WrongType:
				// A verdict, not a failure of the node: not reported as one.
				out[i].Err = redlease.Wrap(redlease.ErrNotHeld, &redlease.NodeError{Addr: addr, Err: script.ErrWrongType})
			default:
				out[i].Err = failAt(ctx, addr, redlease.ErrUnavailable, script.KeyCause(v))
			}
		}
	}
}

// shard is one Cluster master's share of a batch.
type shard struct {
	addr  string
	idx   []int // its items
	calls []batchCall
}

// shardDone is a shard's replies, sent by its goroutine.
type shardDone struct {
	shard   int
	calls   []batchCall // the shard's calls, and those sent again key by key
	replies []reply
}

// extendShards runs ExtendBatch on a Cluster client: items grouped by the
// master that serves their slot, one pipeline per master of ExtendMany
// calls in its local layout (keys of any slot the master serves, one call
// per script.MaxBatch keys), each master's in its own goroutine under its
// own deadline; a key the call could not reach there (its slot moved or is
// migrating) is sent again on its own, following the redirection
// (sendShard). The results of a shard are judged as they arrive. A shard
// that has not answered by its deadline (or by the end of ctx) leaves its
// items undecided; its goroutine ends on its own, at the deadline on a
// client with ContextTimeoutEnabled, after go-redis's ReadTimeout
// otherwise, and nobody reads what it brings.
func (p *Primary) extendShards(ctx context.Context, items []redlease.Extension, valid []int, start time.Time, out []redlease.Extended) {
	var (
		slots   [][]int // items per slot, in the order the slots first appear
		slotIdx = map[int]int{}
		shards  []shard
		byAddr  = map[string]int{}
	)
	for _, i := range valid {
		sl := keySlot(items[i].Key)
		k, ok := slotIdx[sl]
		if !ok {
			k = len(slots)
			slotIdx[sl] = k
			slots = append(slots, nil)
		}
		slots[k] = append(slots[k], i)
	}
	for _, idx := range slots {
		m, err := p.cluster.MasterForKey(ctx, items[idx[0]].Key)
		if err != nil {
			err := p.fail(ctx, items[idx[0]].Key, redlease.ErrUnavailable, err)
			for _, i := range idx {
				out[i].Err = err
			}
			continue
		}
		addr := m.Options().Addr
		k, ok := byAddr[addr]
		if !ok {
			k = len(shards)
			byAddr[addr] = k
			shards = append(shards, shard{addr: addr})
		}
		shards[k].idx = append(shards[k].idx, idx...)
	}
	if len(shards) == 0 {
		return
	}
	for k := range shards {
		shards[k].calls = chunkLocal(items, shards[k].idx)
	}

	deadline := p.shardDeadline(ctx, items, valid)
	sent := time.Now()
	silent := p.silentMasters()
	done := make(chan shardDone, len(shards)) // room for every shard: a straggler never blocks
	for k := range shards {
		go func() {
			sctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			sh := shards[k]
			if silent[sh.addr] {
				// A master that left a call unanswered: wait for the
				// topology to move its keys (topology.go); the pipeline
				// then goes where the Cluster client routes them.
				p.awaitMove(sctx, items[sh.idx[0]].Key, sh.addr, min(maxAwaitMove, time.Until(deadline)/2))
			}
			calls, replies := p.sendShard(sctx, items, sh.calls)
			done <- shardDone{shard: k, calls: calls, replies: replies}
		}()
	}
	answered := make([]bool, len(shards))
	remaining := len(shards)
	take := func(d shardDone) {
		answered[d.shard] = true
		remaining--
		if !silentReplies(d.replies) {
			p.answered(shards[d.shard].addr)
		}
		p.judge(ctx, shards[d.shard].addr, items, d.calls, d.replies, start, out)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var cause error
	for remaining > 0 && cause == nil {
		select {
		case d := <-done:
			take(d)
		case <-timer.C:
			cause = errShardSilent{deadline.Sub(sent)}
		case <-ctx.Done():
			cause = context.Cause(ctx)
		}
	}
	for remaining > 0 { // replies that came together with the deadline still count
		select {
		case d := <-done:
			take(d)
			continue
		default:
		}
		break
	}
	if remaining == 0 {
		return
	}
	for k, sh := range shards {
		if answered[k] {
			continue
		}
		p.markSilent(sh.addr, cause)
		err := failAt(ctx, sh.addr, redlease.ErrUnavailable, cause)
		for _, call := range sh.calls {
			for _, i := range call.idx {
				out[i].Err = err
			}
		}
	}
}

// resent marks, in a reply, a key that sendShard sent again on its own:
// judge leaves it to that call's reply.
const resent = math.MinInt64

// chunkLocal returns ExtendMany calls in the local layout for items idx
// (all on one master), script.MaxBatch keys per call.
func chunkLocal(items []redlease.Extension, idx []int) []batchCall {
	var calls []batchCall
	for rest := idx; len(rest) > 0; {
		n := min(len(rest), script.MaxBatch)
		triples := make([]any, 0, 3*n)
		for _, i := range rest[:n] {
			triples = append(triples, items[i].Key, items[i].Token, items[i].TTL.Milliseconds())
		}
		calls = append(calls, batchCall{idx: rest[:n:n], line: script.ExtendMany.LineLocal(triples)})
		rest = rest[n:]
	}
	return calls
}

// sendShard sends one master's calls as one pipeline on the master's own
// client (the one the topology names now for their first key), followed,
// for replicated writes (clusterwait.go), by one WAIT for the master's
// replicas. Each key the master could not reach (KeyFailed: its slot
// moved or is migrating, the cluster is down) is sent again on its own,
// with its key declared, so that the redirection is followed: by the
// Cluster client, or by onMaster for replicated writes. A call that failed
// whole (BUSY, a timeout) leaves its keys undecided: the renewal after the
// retry delay sends them again. It returns the calls to judge (the
// master's, then those sent again) and their replies.
func (p *Primary) sendShard(ctx context.Context, items []redlease.Extension, calls []batchCall) ([]batchCall, []reply) {
	fail := func(err error) ([]batchCall, []reply) {
		rs := make([]reply, len(calls))
		for k := range rs {
			rs[k].err = err
		}
		return calls, rs
	}
	node, err := p.cluster.MasterForKey(ctx, items[calls[0].idx[0]].Key)
	if err != nil {
		return fail(err)
	}
	p.remember(node)
	need := 0
	if p.waits() {
		if need, err = p.replicasOf(ctx, node); err != nil {
			return fail(err)
		}
	}
	replies := p.send(ctx, node, calls, need)
	var again []int
	for k, r := range replies {
		if r.repl != nil {
			p.forgetReplicaCounts()
		}
		if r.err != nil {
			continue // the whole call failed (BUSY, a timeout): its keys are undecided, retried at the next renewal
		}
		for j, v := range r.vals {
			if v == script.KeyFailed {
				again = append(again, calls[k].idx[j])
				r.vals[j] = resent
			}
		}
	}
	for _, i := range again {
		it := items[i]
		c := batchCall{idx: []int{i}, line: script.ExtendMany.LineMany([]any{it.Key}, []any{it.Token, it.TTL.Milliseconds()})}
		var r reply
		if p.waits() {
			cmd, repl, err := p.onMaster(ctx, script.ExtendMany, it.Key, c.line)
			if err == nil {
				r.vals, err = cmd.Int64Slice()
			}
			r.err, r.repl = err, repl
		} else {
			r.vals, r.err = script.ExtendMany.RunInts(ctx, p.cluster, c.line)
		}
		if r.err == nil && len(r.vals) != 1 {
			r.err = fmt.Errorf("extend batch: %d replies for 1 key", len(r.vals))
		}
		calls = append(calls, c)
		replies = append(replies, r)
	}
	return calls, replies
}

// shardDeadline is when ExtendBatch stops waiting for a Cluster master:
// after nine tenths of the time ctx leaves, and at most nine tenths of the
// shortest validity among the items. A master that does not answer by then
// costs only its own keys: the others' pipelines run at the same time, each
// under this deadline. The last tenth is left to the caller to apply the
// results (the renew watchdog gives a call until the first of its locks'
// deadlines, past which an answer is useless). An earlier version waited
// half of that time, so that the caller could try a silent master's keys
// again; under load a healthy master's pipeline of thousands of per-slot
// calls did not fit in half, and every retry had less time than the one
// before (renew's mixed-strategy test lost every healthy Cluster lock).
func (p *Primary) shardDeadline(ctx context.Context, items []redlease.Extension, valid []int) time.Time {
	now := time.Now()
	wait := time.Duration(math.MaxInt64)
	for _, i := range valid {
		ttl := items[i].TTL
		wait = min(wait, ttl-p.DriftAllowance(ttl))
	}
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, d.Sub(now))
	}
	return now.Add(wait - wait/10)
}

// errShardSilent is the cause recorded for a Cluster master that did not
// answer by its deadline. It matches context.DeadlineExceeded with
// errors.Is.
type errShardSilent struct{ wait time.Duration }

// Error says how long the batch waited.
func (e errShardSilent) Error() string {
	return "no reply within " + e.wait.Round(time.Microsecond).String() + ", the batch's wait for this master"
}

// Is makes errors.Is(err, context.DeadlineExceeded) true.
func (e errShardSilent) Is(target error) bool { return target == context.DeadlineExceeded }

// keySlot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of its hash
// tag (the bytes between the first '{' and the first '}' after it, if there
// are any), or of the whole key, mod 16384.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc) & (clusterSlots - 1)
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// crc16Table is the byte-wise table of CRC16-CCITT (XMODEM: polynomial
// 0x1021, initial value 0), the checksum Redis Cluster hashes keys with.
var crc16Table = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()

// silentReplies reports whether every reply of a shard is an error no
// server answered (judge marks the master silent then).
func silentReplies(rs []reply) bool {
	for _, r := range rs {
		if !unanswered(r.err) {
			return false
		}
	}
	return len(rs) > 0
}
