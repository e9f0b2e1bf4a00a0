package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeProbe measures how long live nodes take to answer: one goroutine per
// node PINGs it through the client it is given (the test's own client to
// that node, so its pool and connections are measured too) every tick,
// and records when each PING was sent and how long its answer took. A
// redis-server the machine does not run answers late, which StallProbe,
// measuring only this process, does not see; a node probe does. Watch
// only nodes the test keeps alive: a PING to a paused node is held for its
// client's read timeout, and one that fails other than by a timeout (the
// node is gone) ends that node's watch.
type NodeProbe struct {
	mu    sync.Mutex
	pings [][]nodePing // per client, in order of sending
	stop  chan struct{}
	wg    sync.WaitGroup
}

// nodePing is one PING: when it was sent and how long its answer took
// (took < 0: none came yet).
type nodePing struct {
	sent time.Time
	took time.Duration
}

// nodeProbeTick is how often a node probe PINGs each node.
const nodeProbeTick = 5 * time.Millisecond

// nodeMaxPings bounds each node's record (and its loop): a PING every tick
// for well over ten minutes.
const nodeMaxPings = 200_000

// StartNodeProbe starts a probe of the nodes behind clients, stopped by
// tb.Cleanup (or Stop). It does not close the clients.
func StartNodeProbe(tb TB, clients ...redis.UniversalClient) *NodeProbe {
	p := &NodeProbe{pings: make([][]nodePing, len(clients)), stop: make(chan struct{})}
	for i, c := range clients {
		p.wg.Go(func() {
			tick := time.NewTicker(nodeProbeTick)
			defer tick.Stop()
			for n := range nodeMaxPings {
				select {
				case <-p.stop:
					return
				case <-tick.C:
				}
				sent := time.Now()
				p.mu.Lock()
				p.pings[i] = append(p.pings[i], nodePing{sent: sent, took: -1})
				p.mu.Unlock()
				err := c.Ping(context.Background()).Err()
				took := time.Since(sent)
				p.mu.Lock()
				p.pings[i][n].took = took
				p.mu.Unlock()
				var ne net.Error
				if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
					return // the node went away: nothing more to measure
				}
				// A PING that ran out of its client's read timeout is
				// recorded as taking that long (its answer took longer).
			}
		})
	}
	tb.Cleanup(p.Stop)
	return p
}

// Stop ends the PINGs and waits for them (a PING in flight returns by its
// client's read timeout). Calling it again is harmless.
func (p *NodeProbe) Stop() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
}

// Worst returns the longest round trip of any PING waiting at some time in
// [from, to], to any node watched (one still unanswered counts until now),
// and how many PINGs that covers: the slowest answer a request to those
// nodes could have met in that stretch.
func (p *NodeProbe) Worst(from, to time.Time) (worst time.Duration, pings int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, node := range p.pings {
		for _, pg := range node {
			took := pg.took
			if took < 0 {
				took = now.Sub(pg.sent)
			}
			if pg.sent.After(to) || pg.sent.Add(took).Before(from) {
				continue
			}
			pings++
			worst = max(worst, took)
		}
	}
	return worst, pings
}

// Late returns, for the watched node with the largest share of its PINGs
// sent in [from, to] that took longer than over (one still unanswered
// counts from its sending until now), which node that is (its index in
// StartNodeProbe's clients), how many of its PINGs were late and how many
// it was sent: when every watched node is needed, the node a request
// could least often have had an answer from within over.
func (p *NodeProbe) Late(from, to time.Time, over time.Duration) (node, late, sent int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	node = -1
	for i, pings := range p.pings {
		var l, n int
		for _, pg := range pings {
			if pg.sent.Before(from) || pg.sent.After(to) {
				continue
			}
			took := pg.took
			if took < 0 {
				took = now.Sub(pg.sent)
			}
			n++
			if took > over {
				l++
			}
		}
		if node < 0 || l*sent > late*n || (sent == 0 && n > 0) {
			node, late, sent = i, l, n
		}
	}
	return node, late, sent
}

// Allowance is bound plus multiple times (what stall measured this process
// stalled in [from, to] + the worst node round trip in it): the window a
// timing assertion over a stretch that needs this process and the watched
// nodes to run allows.
func (p *NodeProbe) Allowance(stall *StallProbe, bound time.Duration, multiple int, from, to time.Time) time.Duration {
	worst, _ := p.Worst(from, to)
	return bound + time.Duration(multiple)*(stall.Stalled(from, to)+worst)
}

// Within reports whether a stretch that began at from and took took ended
// inside Allowance(stall, bound, multiple, from, from+took), with a
// message that gives took and how the window was derived, for the failure.
func (p *NodeProbe) Within(stall *StallProbe, took, bound time.Duration, multiple int, from time.Time) (bool, string) {
	to := from.Add(took)
	stall.settle(to)
	worst, pings := p.Worst(from, to)
	stalled := stall.Stalled(from, to)
	allowed := bound + time.Duration(multiple)*(stalled+worst)
	return took < allowed, fmt.Sprintf("took %v; allowed %v = bound %v + %d × (%v this process was measured stalled + %v the worst of %d PINGs to the live nodes took) in that stretch (worst single stall %v)",
		took.Round(time.Millisecond), allowed.Round(time.Millisecond), bound, multiple, stalled.Round(time.Millisecond),
		worst.Round(time.Millisecond), pings, stall.Worst(from, to).Round(time.Millisecond))
}
