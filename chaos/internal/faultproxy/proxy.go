// Package faultproxy puts an in-process toxiproxy in front of one
// redis-server, for the chaos scenarios' network faults: latency, silence,
// slow and uneven replies, cut connections. It lives in the chaos module, so
// that toxiproxy and what it brings (prometheus, zerolog) stay out of the
// library's module graph; the library's own tests use the hand-written
// redistest.Gate.
package faultproxy

import (
	"context"
	"fmt"
	"strings"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/redlease/redlease/internal/redistest"
)

// Proxy is an in-process toxiproxy in front of one server, for network
// faults: latency, silence, cut connections. Clients of the proxy see the
// faults; clients of the server directly do not, so one node can be cut off
// from some clients only.
//
// Clients connect to a redistest.Gate that forwards to the toxiproxy: the
// gate keeps its port through Cut (toxiproxy gives its listener up when
// stopped, and another process could take the port before Heal listened
// again: "bind: address already in use").
type Proxy struct {
	Addr string // where clients connect: 127.0.0.1:port

	tb    redistest.TB
	front *redistest.Gate
	proxy *toxiproxy.Proxy
}

// New starts a proxy to upstream on a free loopback port and stops it on
// cleanup.
func New(tb redistest.TB, upstream string) *Proxy {
	tb.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "redis-"+upstream, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatalf("faultproxy: start proxy to %s: %v", upstream, err)
	}
	tb.Cleanup(func() {
		// Toxics first: a slicer stopped with its proxy leaves goroutines
		// blocked on a channel send.
		p.Toxics.ResetToxics(context.Background())
		p.Stop()
	})
	front := redistest.NewGate(tb, p.Listen) // closed before the toxiproxy (cleanups run last-in, first-out)
	return &Proxy{Addr: front.Addr, tb: tb, front: front, proxy: p}
}

// Client returns a client that connects through the proxy, closed on
// cleanup, with ContextTimeoutEnabled.
func (p *Proxy) Client() *redis.Client { return p.front.Client() }

// Latency delays every reply by ms milliseconds (± jitterMs) (a downstream latency toxic): the server
// has applied a write before the client sees the answer.
func (p *Proxy) Latency(name string, ms, jitterMs int) {
	p.add(fmt.Sprintf(`{"name":%q,"type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, name, ms, jitterMs))
}

// Silence holds every connection open and passes nothing in either
// direction (a timeout toxic with timeout 0): the realistic silent
// partition, or a node that accepts connections but never answers.
func (p *Proxy) Silence(name string) {
	p.add(fmt.Sprintf(`{"name":%q,"type":"timeout","stream":"upstream","attributes":{"timeout":0}}`, name))
}

// Remove removes one toxic by name.
func (p *Proxy) Remove(name string) {
	p.tb.Helper()
	if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		p.tb.Fatalf("faultproxy: remove toxic %s: %v", name, err)
	}
}

// Cut ends every open connection and, until Heal, refuses new ones, as for
// a crashed node. The port stays the proxy's (see redistest.Gate.Cut).
func (p *Proxy) Cut() { p.front.Cut() }

// Heal removes every toxic and ends a Cut.
func (p *Proxy) Heal() {
	p.proxy.Toxics.ResetToxics(context.Background())
	p.front.Heal()
}

func (p *Proxy) add(spec string) {
	p.tb.Helper()
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		p.tb.Fatalf("faultproxy: add toxic %s: %v", spec, err)
	}
}

// BlackHole passes nothing in either direction and holds the connections
// open: a link that silently stops, e.g. a replication link.
func (p *Proxy) BlackHole(name string) {
	p.add(fmt.Sprintf(`{"name":%q,"type":"timeout","stream":"upstream","attributes":{"timeout":0}}`, name+"-up"))
	p.add(fmt.Sprintf(`{"name":%q,"type":"timeout","stream":"downstream","attributes":{"timeout":0}}`, name+"-down"))
}

// SilenceReplies lets requests through but holds back every reply: the
// server applies a write, the client never learns it did (an ambiguous
// reply).
func (p *Proxy) SilenceReplies(name string) {
	p.add(fmt.Sprintf(`{"name":%q,"type":"timeout","stream":"downstream","attributes":{"timeout":0}}`, name))
}

// Slice cuts replies into small chunks with a delay between them (a slicer
// toxic): a degraded link that delivers slowly and unevenly.
func (p *Proxy) Slice(name string, avgBytes, delayMicros int) {
	p.add(fmt.Sprintf(`{"name":%q,"type":"slicer","stream":"downstream","attributes":{"average_size":%d,"size_variation":%d,"delay":%d}}`,
		name, avgBytes, avgBytes/2, delayMicros))
}
