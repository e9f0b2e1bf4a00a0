package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// Found by the simulator (TestFindingBarrierNotOwnerAfterEffect, seed 10542
// of its barrier scenario). The handler ran and succeeded, but its result
// reached the store only after its lease ran out and another caller had
// taken the request over: the store refuses it (not the owner). The
// effect happened, so Do must say ErrNotRecorded ("do not run it again"),
// not a bare ErrNotOwner ("nothing ran, redeliver"). Forced order: A's
// result is held in a gate until B has taken over and finished.
func TestResultRefusedAfterTakeoverIsNotRecordedNotFailed(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	slow := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 30 * time.Second}) // waits for the held reply
	t.Cleanup(func() { _ = slow.Close() })
	const lease = 300 * time.Millisecond
	a := barrier(t, slow, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	b := barrier(t, srv.Client(), idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "charge:7"}

	gate.HoldRequests("charged by a") // A's result, on its way to the store
	type done struct {
		out idempotency.Outcome
		err error
	}
	aDone := make(chan done, 1)
	go func() {
		out, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("charged by a"), nil })
		aDone <- done{out, err}
	}()
	require.NoError(t, gate.WaitHeld(1, "charged by a", 5*time.Second), "A's result is held")

	// A's lease runs out; B takes the request over and runs it.
	var bOut idempotency.Outcome
	var err error
	for range 100 {
		bOut, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("charged by b"), nil })
		if !errors.Is(err, idempotency.ErrInProgress) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	assert.Equal(t, "charged by b", string(bOut.Result))

	require.NoError(t, gate.Step("charged by a", 5*time.Second)) // A's result lands: refused
	gate.Open()
	d := redistest.Await(t, probe, aDone, 10*time.Second, 3, "A's Do did not return")
	t.Logf("A: %v", d.err)
	require.ErrorIs(t, d.err, idempotency.ErrNotRecorded, "the handler ran: its effect happened, unrecorded")
	// And why: the store refused it (taken over), or — A's store calls end
	// with its lock's validity, whatever the client's read timeout — no
	// reply came before then and the result may still land (refused).
	assert.True(t, errors.Is(d.err, idempotency.ErrNotOwner) || errors.Is(d.err, context.DeadlineExceeded), "and why: %v", d.err)
	assert.Equal(t, "charged by a", string(d.out.Result))
}

// A run whose lock was lost is reported in one line, with every cause
// reachable by errors.Is: the cancelled run, the loss, the handler's own
// error.
func TestRunCancelledErrorIsOneLine(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	b := barrier(t, srv.Client(), idempotency.WithLease(300*time.Millisecond), idempotency.WithRetention(time.Minute))
	_, err := b.Do(t.Context(), idempotency.Request{Key: "oneline"}, func(ctx context.Context, _ uint64) ([]byte, error) {
		<-ctx.Done() // the lease runs out: the lock is lost
		return nil, ctx.Err()
	})
	require.ErrorIs(t, err, idempotency.ErrRunCancelled)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotContains(t, err.Error(), "\n", "one line")
	t.Log(err)
}
