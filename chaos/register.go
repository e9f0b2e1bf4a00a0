package chaos

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
)

// Register is a fenced register living in a real Redis: it accepts a write
// only with a fence strictly greater than the last fence it accepted. It
// stands for the storage a lock protects ("UPDATE … WHERE fence < ?"), and it
// must live on a server the scenario never faults, so that any anomaly it
// records is the lock's and not the storage's. Every operation is recorded
// on the Recorder's clock for the checker. Safe for concurrent use.
type Register struct {
	rec    *Recorder
	client redis.UniversalClient
	key    string
}

// Register returns a fenced register stored in the hash key on client,
// recording into r. A fresh key reads as fence 0, value 0, so fence 0 (a
// strategy with fencing off) is always refused. Several registers with
// different keys may share a recorder; each is checked on its own.
func (r *Recorder) Register(client redis.UniversalClient, key string) *Register {
	return &Register{rec: r, client: client, key: key}
}

// fencedWrite is the whole compare-and-set in one script, so the server
// applies it atomically. Fences travel as decimal strings and are compared
// by length, then lexically: exact for every uint64, where Lua's doubles
// would round above 2^53. It returns {accepted, fence, value}: the new state
// when accepted, the state that refused the write otherwise.
var fencedWrite = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'fence', 'value')
local f, v = cur[1], cur[2]
if not f then f = '0' end
if not v then v = '0' end
local nf = ARGV[1]
if #nf > #f or (#nf == #f and nf > f) then
  redis.call('HSET', KEYS[1], 'fence', nf, 'value', ARGV[2])
  return {1, nf, ARGV[2]}
end
return {0, f, v}
`)

// Write offers value under fence on behalf of holder and reports whether the
// register accepted it. Call and return times are recorded on the
// recorder's clock. When err is not nil the write may or may not have taken
// effect (a timeout can hide an applied write), and the checker treats it
// so.
func (g *Register) Write(ctx context.Context, holder string, fence uint64, value int64) (accepted bool, err error) {
	in := registerInput{Key: g.key, Holder: holder, Write: true, Fence: fence, Value: value}
	call := g.rec.Now()
	out, err := g.write(ctx, fence, value)
	ret := g.rec.Now()
	if err != nil {
		out = registerOutput{Unknown: true}
	}
	g.rec.addOp(registerOp{in: in, out: out, call: call, ret: ret, err: err})
	return out.Accepted, err
}

func (g *Register) write(ctx context.Context, fence uint64, value int64) (registerOutput, error) {
	reply, err := fencedWrite.Run(ctx, g.client, []string{g.key},
		strconv.FormatUint(fence, 10), strconv.FormatInt(value, 10)).Slice()
	if err != nil {
		return registerOutput{}, fmt.Errorf("chaos: register write %s: %w", g.key, err)
	}
	if len(reply) != 3 {
		return registerOutput{}, fmt.Errorf("chaos: register write %s: reply %v, want 3 elements", g.key, reply)
	}
	ok, isInt := reply[0].(int64)
	if !isInt {
		return registerOutput{}, fmt.Errorf("chaos: register write %s: accepted flag %v is not an integer", g.key, reply[0])
	}
	f, v, err := parseState(reply[1], reply[2])
	if err != nil {
		return registerOutput{}, fmt.Errorf("chaos: register write %s: %w", g.key, err)
	}
	return registerOutput{Accepted: ok == 1, Fence: f, Value: v}, nil
}

// Read returns the register's last accepted fence and value on behalf of
// holder. A successful read is recorded for the checker; a failed one is
// not, since a read that returned nothing constrains nothing.
func (g *Register) Read(ctx context.Context, holder string) (fence uint64, value int64, err error) {
	call := g.rec.Now()
	vals, err := g.client.HMGet(ctx, g.key, "fence", "value").Result()
	ret := g.rec.Now()
	if err != nil {
		return 0, 0, fmt.Errorf("chaos: register read %s: %w", g.key, err)
	}
	fence, value, err = parseState(vals[0], vals[1])
	if err != nil {
		return 0, 0, fmt.Errorf("chaos: register read %s: %w", g.key, err)
	}
	g.rec.addOp(registerOp{
		in:   registerInput{Key: g.key, Holder: holder},
		out:  registerOutput{Fence: fence, Value: value},
		call: call, ret: ret,
	})
	return fence, value, nil
}

// parseState turns the two stored fields (nil when absent) into numbers.
func parseState(rawFence, rawValue any) (uint64, int64, error) {
	fs, vs := "0", "0"
	if rawFence != nil {
		s, ok := rawFence.(string)
		if !ok {
			return 0, 0, fmt.Errorf("fence %v is not a string", rawFence)
		}
		fs = s
	}
	if rawValue != nil {
		s, ok := rawValue.(string)
		if !ok {
			return 0, 0, fmt.Errorf("value %v is not a string", rawValue)
		}
		vs = s
	}
	f, err := strconv.ParseUint(fs, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("fence: %w", err)
	}
	v, err := strconv.ParseInt(vs, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("value: %w", err)
	}
	return f, v, nil
}

// registerInput is what an operation asked for: a write of Value under
// Fence, or a read (Write false).
type registerInput struct {
	Key, Holder string
	Write       bool
	Fence       uint64
	Value       int64
}

// registerOutput is what the operation saw: the register's state after a
// write (the new state if accepted, the refusing state if not) or the state
// a read returned. Unknown marks a write whose call failed.
type registerOutput struct {
	Unknown  bool
	Accepted bool
	Fence    uint64
	Value    int64
}

// registerOp is one recorded operation, with call and return on the
// recorder's clock.
type registerOp struct {
	in        registerInput
	out       registerOutput
	call, ret time.Duration
	err       error
}

// registerState is the sequential register: the last accepted fence and
// its value. Comparable, so porcupine's default equality works.
type registerState struct {
	Fence uint64
	Value int64
}

// registerModel is the sequential specification porcupine checks the
// history against, one partition per register key.
func registerModel() porcupine.Model {
	return porcupine.Model{
		Partition: partitionByKey,
		Init:      func() any { return registerState{} },
		Step:      stepRegister,
		Hash: func(s any) uint64 {
			st := s.(registerState)
			return st.Fence*1_000_003 ^ uint64(st.Value)
		},
		DescribeOperation: describeOperation,
		DescribeState: func(s any) string {
			st := s.(registerState)
			return fmt.Sprintf("fence=%d value=%d", st.Fence, st.Value)
		},
	}
}

// stepRegister is the fenced register, sequentially: a write applies iff
// its fence is above the state's, and what the client saw must match. A
// write whose outcome is unknown matches either way; it was given a return
// time at the end of the history, so the checker may place it where it
// took effect or after everything, where it no longer matters.
func stepRegister(state, input, output any) (bool, any) {
	s := state.(registerState)
	in := input.(registerInput)
	out := output.(registerOutput)
	if !in.Write {
		return out.Fence == s.Fence && out.Value == s.Value, s
	}
	applies := in.Fence > s.Fence
	next := s
	if applies {
		next = registerState{Fence: in.Fence, Value: in.Value}
	}
	if out.Unknown {
		return true, next
	}
	return out.Accepted == applies && out.Fence == next.Fence && out.Value == next.Value, next
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		key := op.Input.(registerInput).Key
		i, ok := byKey[key]
		if !ok {
			i = len(parts)
			byKey[key] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

func describeOperation(input, output any) string {
	in := input.(registerInput)
	out := output.(registerOutput)
	if !in.Write {
		return fmt.Sprintf("%s: read() → fence=%d value=%d", in.Holder, out.Fence, out.Value)
	}
	call := fmt.Sprintf("%s: write(fence=%d, value=%d)", in.Holder, in.Fence, in.Value)
	switch {
	case out.Unknown:
		return call + " → ? (failed; may have taken effect)"
	case out.Accepted:
		return call + " → accepted"
	default:
		return fmt.Sprintf("%s → rejected (fence=%d value=%d)", call, out.Fence, out.Value)
	}
}

// WriteBy records a write another process made to this register (a
// re-executed holder, say) and reported back: call must be a time before
// that process could have sent it and ret a time after it answered, on this
// recorder's clock. The bracket is wider than the real call, which only
// ever makes the linearizability check more lenient, never wrong.
func (g *Register) WriteBy(holder string, fence uint64, value int64, accepted bool, stateFence uint64, stateValue int64, call, ret time.Duration) {
	g.rec.addOp(registerOp{
		in:   registerInput{Key: g.key, Holder: holder, Write: true, Fence: fence, Value: value},
		out:  registerOutput{Accepted: accepted, Fence: stateFence, Value: stateValue},
		call: call, ret: ret,
	})
}
