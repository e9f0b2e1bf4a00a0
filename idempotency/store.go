package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redlease/redlease/internal/bounded"
)

func (b *Barrier) peek(ctx context.Context, rec, fp string) (status, error) {
	reply, err := bounded.Call(ctx, b.bound, func(ctx context.Context) ([]any, error) {
		return peekScript.Run(ctx, b.store, []string{rec}, fp).Slice()
	}, nil)
	if err != nil {
		return status{}, fmt.Errorf("idempotency: read %s: %w", rec, err)
	}
	return parseStatus(reply)
}

func (b *Barrier) claim(ctx context.Context, rec, owner string, fence uint64, fp string) (status, error) {
	// An abandoned claim that lands later leaves a record owned by a lock
	// this run gives up: the next request takes it over (its owner's lock
	// is gone), as after a crash.
	reply, err := bounded.Call(ctx, b.bound, func(ctx context.Context) ([]any, error) {
		return claimScript.Run(ctx, b.store, []string{rec}, owner, strconv.FormatUint(fence, 10), fp, b.retention.Milliseconds(), b.scheme).Slice()
	}, nil)
	if err != nil {
		return status{}, fmt.Errorf("idempotency: claim %s: %w", rec, err)
	}
	return parseStatus(reply)
}

// errRecordGone: complete found no record at all (it expired, or the
// store lost it).
var errRecordGone = errors.New("the record is gone (expired, or lost by the store)")

func (b *Barrier) complete(ctx context.Context, rec, owner, kind string, result []byte) error {
	// An abandoned completion may still land: the caller is told the
	// outcome is unknown (ErrNotRecorded), and a duplicate then replays it.
	line := completeScript.Args(rec, owner, kindArg(kind), result, b.retentionMillis)
	var (
		n   int64
		err error
	)
	if b.bound {
		n, err = bounded.Call(ctx, true, func(ctx context.Context) (int64, error) {
			return completeScript.Run(ctx, b.store, line)
		}, nil)
	} else {
		// Called directly: the closure bounded.Call takes escapes, and
		// would cost every first request an allocation.
		n, err = completeScript.Run(ctx, b.store, line)
	}
	switch {
	case err != nil:
		return fmt.Errorf("idempotency: complete %s: %w", rec, err)
	case n == -1:
		return fmt.Errorf("idempotency: complete %s: %w", rec, errRecordGone)
	case n != 1:
		return ErrNotOwner
	}
	return nil
}

// release forgets the record if owner still owns it in progress: ok false
// if not (taken over, or gone).
func (b *Barrier) release(ctx context.Context, rec, owner string) (ok bool, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.lease)
	defer cancel()
	n, err := bounded.Call(rctx, b.bound, func(ctx context.Context) (int64, error) {
		return releaseScript.Run(ctx, b.store, []string{rec}, owner).Int64()
	}, nil)
	if err != nil {
		return false, fmt.Errorf("idempotency: release %s: %w", rec, err)
	}
	return n == 1, nil
}

// renewRecord keeps owner's in-progress record for at least the retention
// from now.
func (b *Barrier) renewRecord(ctx context.Context, rec, owner string) error {
	_, err := bounded.Call(ctx, b.bound, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, renewScript.Run(ctx, b.store, []string{rec}, owner, b.retention.Milliseconds()).Err()
	}, nil)
	return err
}
