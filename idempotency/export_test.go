package idempotency

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/script"
)

// LoadScripts puts every script of the package into c's script cache, so
// that a test that counts or holds a store's commands sees no NOSCRIPT
// round trip (a script's first use after a start sends EVALSHA, then
// EVAL).
func LoadScripts(ctx context.Context, c redis.Scripter) error {
	for _, s := range []*redis.Script{peekScript, claimScript, renewScript, releaseScript, consumeScript} {
		if err := s.Load(ctx, c).Err(); err != nil {
			return err
		}
	}
	for _, s := range []*script.Script{claimLockScript, completeScript, undoClaimScript} {
		if err := s.Load(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// ClaimLockHash is the SHA1 of the script that reads a request's record,
// takes its lock and claims it in one step (the default strategy on a
// one-Redis store), as EVALSHA sends it: a test's hook tells a claim by it.
func ClaimLockHash() string { return claimLockScript.Hash() }

// SetCloseAfterStop makes b's Close, after it cancelled the handlers of
// the runs in flight, call f with the channel that closes once those runs
// have finished, until tb's cleanup.
func SetCloseAfterStop(tb interface{ Cleanup(func()) }, b *Barrier, f func(idle <-chan struct{})) {
	hook := func(of *Barrier, idle <-chan struct{}) {
		if of == b {
			f(idle)
		}
	}
	closeAfterStop.Store(&hook)
	tb.Cleanup(func() { closeAfterStop.Store(nil) })
}
