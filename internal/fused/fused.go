// Package fused carries a fused acquisition from a Locker's TryLock to its
// strategy: an attempt whose script takes the lock and does more on the
// same node in the same round trip (the idempotency Barrier's claim, which
// also reads and claims a request's record). internal/primary runs it
// through the same acquisition as its own script (Primary.AcquireFused).
//
// Package redlease sets Option when it is initialised; this package cannot
// import it (redlease imports this package), so Option hands the
// LockOption back as any.
package fused

import (
	"context"
	"time"
)

// Script is one attempt's fused script. It must take and refuse the lock
// exactly as script.Acquire does with fencing (not fair, the
// delayed-restart rule off), and may read and write other keys beside it.
type Script interface {
	// AppendLine appends the script's command line for one attempt on
	// key, whose fence counter is fenceKey, under token, with the lock's
	// TTL and the counter's in ms, boxed as script.Acquire takes them.
	AppendLine(line []any, key, fenceKey, token string, ttlMillis, fenceTTLMillis any) []any
	// Run sends line and answers as script.Acquire's reply would: a fence
	// above 0 for a grant, a refusal (script.IsTaken), a failure, or an
	// error that errors.Is redlease.ErrNotObtained when the script took
	// nothing and is answered by what it read (the acquisition returns it
	// as it is).
	Run(ctx context.Context, line []any) (int64, error)
	// Undo removes what an attempt under token may have written (the lock
	// key, by that token, and whatever else the script wrote under it),
	// bounded by ctx whatever the client's options (internal/bounded). It
	// publishes the undo notice, not a release's.
	Undo(ctx context.Context, key, token string)
}

// Acquirer is a strategy that runs fused acquisitions; G is redlease.Grant.
type Acquirer[G any] interface {
	// AcquireFused is Acquire running s in place of the lock's own script.
	AcquireFused(ctx context.Context, key, token string, ttl time.Duration, s Script) (G, error)
}

// Option returns the redlease.LockOption, as any, that makes an attempt
// (TryLock) run s on its strategy, which must be an Acquirer. Set by
// package redlease.
var Option func(s Script) any
