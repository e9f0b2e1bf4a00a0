package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/renew"
)

// The Revoke workload (revokeClient): every client but the last takes
// keys with Lock and keeps each lock alive with a renew.Watchdog of its
// own while it writes to the fenced register, then releases it; the last
// client is an operator who, now and then, inspects a key
// (Locker.Inspect) and, if it is held, forces its release by the token it
// saw (Locker.ForceRelease). A forced release ends mutual exclusion for
// the revoked holder until its next renewal, by design: a hold whose token
// an operator deleted is not in overlap with a hold granted after the
// force was sent (Hold.Revoked), and state-valid stops checking it; fences
// must still rise (fence-order) and the register must still refuse the
// revoked holder's late writes (stale-accepted).

// InvRevokeLost: in a scenario without faults, a holder whose token a
// forced release deleted (ForceRelease returned nil) while it still
// believed it held the key learned of it at its next renewal: its Lost
// closed within a renewal interval (a third of its TTL) plus revokeSlack
// of the force's return.
const InvRevokeLost = "revoke-lost"

// InvInspectTrue: an Inspect that said a key was held named a token some
// attempt of the workload's sent for that key, and, on one node (single),
// the fence of that token's grant when it was granted.
const InvInspectTrue = "inspect-true"

// ExRevokeExcused: pairs of holds of one key that overlap only after the
// first one's token was force-released (not overlap violations).
const ExRevokeExcused = InvOverlap + "/revoked"

// revokeSlack is what revoke-lost allows past the renewal interval: the
// renewal's round trip and the watchdog's batching, on a network without
// faults.
const revokeSlack = 20 * time.Millisecond

func init() {
	examinedIn[InvRevokeLost] = func(sc *Scenario) bool { return sc.Revoke && !sc.Faults }
	examinedIn[InvInspectTrue] = func(sc *Scenario) bool { return sc.Revoke }
	examinedIn[ExRevokeExcused] = func(sc *Scenario) bool { return sc.Revoke }
}

// revocation is one forced release the operator sent.
type revocation struct {
	key, token string
	sent, at   time.Duration // sent, and returned
	err        error
}

// revokeClient is one Revoke client (see above): the operator if ci is
// the last client, a holder otherwise.
func (w *World) revokeClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	if ci == w.sc.Clients-1 {
		w.operator(ci, locker, r)
		return
	}
	wd := must(renew.New())
	w.onClose(ci, func() { wd.Close() })
	for seq := range w.sc.Ops {
		key := fmt.Sprintf("k%d", r.IntN(w.sc.Keys))
		ttl := w.drawTTL(r)
		cd := ms(r, 50, 400)
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitRevoke, seq), cd)
		start := w.hist.now()
		lk, err := locker.Lock(ctx, key, redlease.WithTTL(ttl))
		cancel()
		w.checkCtx(ci, "lock", key, start, cd, true)
		if err != nil {
			w.hist.failed()
			w.hist.logf("c%d#%d lock %s ttl=%v: %v", ci, seq, key, ttl, short(err))
			sleep(ms(r, 0, 30))
			continue
		}
		w.holdKept(ci, seq, key, ttl, lk, wd, r)
		sleep(ms(r, 0, 20))
	}
}

// holdKept runs one kept hold to its end: writes while the lock says it
// is valid, for up to two TTLs (the watchdog renews it), then a release.
func (w *World) holdKept(ci, seq int, key string, ttl time.Duration, lk *redlease.Lock, wd *renew.Watchdog, r *rand.Rand) {
	hd := &Hold{Client: ci, Seq: seq, Key: key, Via: "kept", Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token(), TTL: ttl}
	w.hist.logf("c%d#%d kept %s ttl=%v granted fence=%d until=+%.3fms", ci, seq, key, ttl, lk.Fence(), msf(time.Until(lk.Until())))
	w.mu.Lock()
	w.revokeGrants[lk.Token()] = lk.Fence()
	w.mu.Unlock()
	lost := lk.Lost()
	done := make(chan struct{})
	go func() { // owned by this call, which waits for it below; Lost closes by Until at the latest
		<-lost
		hd.LostAt = w.hist.now()
		close(done)
	}()
	live := w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), key, lk, w.placeOf("", key))
	stop := wd.Keep(lk)
	for step := range 1 + r.IntN(4) {
		sleep(time.Duration(r.Int64N(int64(ttl / 2))))
		if lk.Valid() {
			sleep(w.writePause(ci, seq, step, ttl))
			w.hist.write(ci, seq, key, lk.Fence())
		}
	}
	stop()
	d := ms(r, 20, 200)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	hd.RelSent = w.hist.now()
	err := lk.Release(ctx)
	cancel()
	w.checkCtx(ci, "release", key, hd.RelSent, d, false)
	w.hist.logf("c%d#%d release %s: %v", ci, seq, key, short(err))
	<-done
	w.untrack(live)
	hd.Until = w.untilV(ci, lk)
	hd.To = min(hd.LostAt, hd.Until)
	w.hist.logf("c%d#%d end %s: %s (%v)", ci, seq, key, hd, short(lk.Err()))
	w.hist.addHold(hd)
}

// operator inspects keys and forces the release of those held.
func (w *World) operator(ci int, locker *redlease.Locker, r *rand.Rand) {
	for seq := range 3 * w.sc.Ops {
		sleep(ms(r, 10, 120))
		key := fmt.Sprintf("k%d", r.IntN(w.sc.Keys))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		in, err := locker.Inspect(ctx, key)
		cancel()
		w.hist.logf("c%d#%d inspect %s: %s %q fence=%d: %v", ci, seq, key, in.State, in.Token, in.Fence, short(err))
		if err != nil || in.State != redlease.KeyHeld {
			continue
		}
		w.checkInspect(ci, seq, key, in)
		if r.IntN(2) == 0 {
			continue // looked only
		}
		if r.IntN(2) == 0 {
			// The operator reads, then confirms (the CLI's prompt): the
			// key may change hands meanwhile, and the force, by the
			// token seen, must then delete nothing.
			sleep(ms(r, 0, 150))
		}
		rv := revocation{key: key, token: in.Token, sent: w.hist.now()}
		w.revokeIntent(in.Token)
		ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, rv.err = locker.ForceRelease(ctx, key, in.Token)
		cancel()
		rv.at = w.hist.now()
		w.hist.logf("c%d#%d force-release %s %s: %v", ci, seq, key, in.Token, short(rv.err))
		w.mu.Lock()
		w.revokes = append(w.revokes, rv)
		w.mu.Unlock()
	}
}

// checkInspect checks inspect-true for one Inspect that said key was held.
func (w *World) checkInspect(ci, seq int, key string, in redlease.Inspection) {
	w.hist.ex.count(InvInspectTrue, 1)
	w.mu.Lock()
	fence, granted := w.revokeGrants[in.Token]
	w.mu.Unlock()
	sent := w.tokenSent(key, in.Token)
	switch {
	case !sent:
		w.hist.violation(Violation{Inv: InvInspectTrue, At: w.hist.now(), Detail: fmt.Sprintf("c%d#%d inspect %s: held by %q, a token no attempt sent for the key", ci, seq, key, in.Token)})
	case granted && w.sc.Strategy == Single && in.Fence != fence:
		w.hist.violation(Violation{Inv: InvInspectTrue, At: w.hist.now(), Detail: fmt.Sprintf("c%d#%d inspect %s: token %q with fence %d, granted with %d", ci, seq, key, in.Token, in.Fence, fence)})
	}
}

// tokenSent reports whether some node was sent an acquisition of key under
// token (the Acquire script's first key and first argument).
func (w *World) tokenSent(key, token string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.revokeSent[key+"\x00"+token]
}

// revokeIntent marks token revoked before the forced release is sent:
// from then on its delete may land at any moment, and state-valid no
// longer checks a lock under it, one tracked later too (its grant's reply
// may still be on its way to the holder).
func (w *World) revokeIntent(token string) {
	st := &w.state
	st.mu.Lock()
	if st.revoked == nil {
		st.revoked = map[string]bool{}
	}
	st.revoked[token] = true
	st.mu.Unlock()
}

// applyRevokes marks the holds whose token a forced release may have
// deleted (it returned nil or ErrUnavailable) with the time it was sent
// (Hold.Revoked), before the history is checked.
func (w *World) applyRevokes() {
	w.mu.Lock()
	revs := append([]revocation(nil), w.revokes...)
	w.mu.Unlock()
	if len(revs) == 0 {
		return
	}
	w.hist.mu.Lock()
	defer w.hist.mu.Unlock()
	for _, rv := range revs {
		if rv.err != nil && !errors.Is(rv.err, redlease.ErrUnavailable) {
			continue // nothing deleted
		}
		for _, hd := range w.hist.holds {
			if hd.Key == rv.key && hd.Token == rv.token && (hd.Revoked == 0 || rv.sent < hd.Revoked) {
				hd.Revoked = rv.sent
			}
		}
	}
}

// checkRevokes checks revoke-lost (see InvRevokeLost).
func (w *World) checkRevokes() []Violation {
	if w.sc.Faults {
		return nil
	}
	w.mu.Lock()
	revs := append([]revocation(nil), w.revokes...)
	w.mu.Unlock()
	w.hist.mu.Lock()
	defer w.hist.mu.Unlock()
	var vs []Violation
	for _, rv := range revs {
		if rv.err != nil {
			continue
		}
		for _, hd := range w.hist.holds {
			if hd.Key != rv.key || hd.Token != rv.token || hd.To <= rv.at || (hd.RelSent >= 0 && hd.RelSent <= rv.at+hd.TTL/3+revokeSlack) {
				continue // not believed past the force, or released by its holder before it must have learned
			}
			w.hist.ex.count(InvRevokeLost, 1)
			if bound := rv.at + hd.TTL/3 + revokeSlack; hd.LostAt < 0 || hd.LostAt > bound {
				vs = append(vs, Violation{Inv: InvRevokeLost, At: rv.at, Detail: fmt.Sprintf("%s: its token force-released at %.3fms, Lost closed at %.3fms, past %.3fms (a renewal interval %v + %v)", hd, msf(rv.at), msf(hd.LostAt), msf(bound), hd.TTL/3, revokeSlack), Holds: []*Hold{hd}})
			}
		}
	}
	return vs
}
