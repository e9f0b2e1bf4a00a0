package primary

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/script"
)

// Proclaim records an election's leader beside key, only while key holds
// token (script.Proclaim), followed by WAIT when replicas are required,
// within CallBound or ctx, whichever ends first, whatever the client's
// options (see redlease.Elector).
func (p *Primary) Proclaim(ctx context.Context, key, token string, term uint64, value string, ttl time.Duration, write bool) error {
	if err := script.CheckKey(key); err != nil {
		return err
	}
	if token == "" {
		return redlease.Invalid("empty token")
	}
	ctx, cancel := context.WithTimeout(ctx, p.CallBound())
	defer cancel()
	line := script.ProclaimArgs(key, token, term, value, max(ttl.Milliseconds(), 1), write)
	v, err := bounded.Call(ctx, p.bound, func(ctx context.Context) (int64, error) {
		return p.run(ctx, script.Proclaim, key, line)
	}, nil)
	p.heard(ctx, key, err)
	switch {
	case err != nil && !(errors.Is(err, ErrNotReplicated) && v == 0):
		return p.fail(ctx, key, redlease.ErrUnavailable, err)
	case v == 0:
		return fmt.Errorf("%w: the election's key does not hold the leader's token", redlease.ErrNotHeld)
	}
	return nil
}

// Leader reads key's holder and election record in one atomic step
// (script.Leader), within CallBound or ctx, whichever ends first,
// whatever the client's options (see redlease.Elector).
func (p *Primary) Leader(ctx context.Context, key string) (redlease.Leader, error) {
	if err := script.CheckKey(key); err != nil {
		return redlease.Leader{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.CallBound())
	defer cancel()
	line := script.LeaderArgs(key)
	v, err := bounded.Call(ctx, p.bound, func(ctx context.Context) (any, error) {
		return script.Leader.RunValue(ctx, p.client, line)
	}, nil)
	p.heard(ctx, key, err)
	if err != nil {
		return redlease.Leader{}, p.fail(ctx, key, redlease.ErrUnavailable, err)
	}
	return parseLeader(v)
}

// parseLeader reads script.Leader's reply.
func parseLeader(v any) (redlease.Leader, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return redlease.Leader{}, fmt.Errorf("%w: leader: unexpected reply %v", redlease.ErrUnavailable, v)
	}
	switch n, _ := a[0].(int64); {
	case n == 0:
		return redlease.Leader{}, fmt.Errorf("%w: nobody holds the election's key", redlease.ErrNoLeader)
	case n == 2:
		return redlease.Leader{}, fmt.Errorf("%w: the key's holder has recorded no value", redlease.ErrNoLeader)
	case n != 1 || len(a) != 3:
		return redlease.Leader{}, fmt.Errorf("%w: leader: unexpected reply %v", redlease.ErrUnavailable, v)
	}
	ts, _ := a[1].(string)
	val, _ := a[2].(string)
	term, err := strconv.ParseUint(ts, 10, 64)
	if err != nil {
		return redlease.Leader{}, fmt.Errorf("%w: leader: unreadable term %q", redlease.ErrUnavailable, ts)
	}
	return redlease.Leader{Term: term, Value: val}, nil
}

// WatchLeader subscribes, on a connection of its own, to key's election
// channel (script.LeaderChannel: proclamations) and wake channel
// (script.Channel: releases), and returns once the node confirmed both,
// within WatchBound or ctx, whichever ends first, whatever the client's
// options (see redlease.Elector).
func (p *Primary) WatchLeader(ctx context.Context, key string) (redlease.LeaderWatch, error) {
	if err := script.CheckKey(key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, WatchBound)
	defer cancel()
	chans := []string{script.LeaderChannel(key), script.Channel(key)}
	return bounded.Call(ctx, p.bound, func(ctx context.Context) (redlease.LeaderWatch, error) {
		ps := p.client.Subscribe(ctx, chans...)
		left := time.Until(deadlineOf(ctx))
		for confirmed := 0; confirmed < len(chans); {
			m, err := ps.ReceiveTimeout(ctx, max(left, time.Millisecond))
			if err != nil {
				_ = ps.Close()
				return nil, fmt.Errorf("%w: subscribe: %w", redlease.ErrUnavailable, err)
			}
			if _, ok := m.(*redis.Subscription); ok {
				confirmed++
			}
			left = time.Until(deadlineOf(ctx))
		}
		return &leaderWatch{ps: ps}, nil
	}, func(w redlease.LeaderWatch, err error) {
		if w != nil {
			_ = w.Close() // abandoned: nobody will use it
		}
	})
}

// deadlineOf is ctx's deadline (WatchLeader's ctx always has one).
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// leaderWatch is a subscription made by WatchLeader.
type leaderWatch struct{ ps *redis.PubSub }

// Wait waits at most d for a message on the subscription: the socket's
// read deadline is d, whatever the client's options.
func (w *leaderWatch) Wait(ctx context.Context, d time.Duration) (bool, error) {
	m, err := w.ps.ReceiveTimeout(ctx, max(d, time.Millisecond))
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false, nil
		}
		return false, err
	}
	switch m.(type) {
	case *redis.Message, *redis.Subscription: // a resubscription may follow a missed message
		return true, nil
	}
	return false, nil
}

// Close ends the subscription and closes its connection.
func (w *leaderWatch) Close() error { return w.ps.Close() }
