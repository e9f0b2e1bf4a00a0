package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// nodeFlags are the connection settings every command shares.
type nodeFlags struct {
	nodes    string
	username string
	password string
	tls      bool
	tlsCA    string
	prefix   string
	strategy string
	master   string
	timeout  time.Duration
	replicas int
	maxTTL   time.Duration
	durable  bool
}

func newRoot() *cobra.Command {
	var nf nodeFlags
	root := &cobra.Command{
		Use:           "redlease",
		Short:         "Distributed locks on Redis: guard commands across hosts, inspect locks, check nodes",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			usage := func(format string, args ...any) error { return &exitError{exitUsage, fmt.Errorf(format, args...)} }
			switch {
			case nf.timeout <= 0:
				return usage("--node-timeout %v: must be positive", nf.timeout)
			case nf.maxTTL < 0:
				return usage("--max-ttl %v: must not be negative (0: off)", nf.maxTTL)
			case nf.replicas < 0:
				return usage("--replicas %d: must not be negative", nf.replicas)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&nf.nodes, "nodes", os.Getenv("REDLEASE_NODES"), "comma-separated host:port of the Redis nodes (default $REDLEASE_NODES); Sentinels with --strategy failover")
	pf.StringVar(&nf.username, "user", os.Getenv("REDLEASE_USER"), "ACL user (default $REDLEASE_USER)")
	pf.StringVar(&nf.password, "password", "", "password (default $REDLEASE_PASSWORD; prefer the variable, flags show in ps)")
	pf.BoolVar(&nf.tls, "tls", false, "connect with TLS")
	pf.StringVar(&nf.tlsCA, "tls-ca", "", "PEM file of the CA that signed the nodes' certificates (default: the system pool)")
	pf.StringVar(&nf.prefix, "prefix", "lock:", `key prefix ("lock:", as docs/redis-acl.conf assumes; a library Locker shares locks with the CLI only with redlease.WithPrefix("lock:"), its default is none)`)
	pf.StringVar(&nf.strategy, "strategy", "", "single, quorum or failover (default: single for one node, quorum with fencing for several)")
	pf.StringVar(&nf.master, "master", "", "Sentinel master name (--strategy failover)")
	pf.DurationVar(&nf.timeout, "node-timeout", quorum.DefaultNodeTimeout, "quorum: how long one round waits for the nodes")
	pf.IntVar(&nf.replicas, "replicas", failover.DefaultReplicas, "failover: replicas that must acknowledge each write")
	pf.DurationVar(&nf.maxTTL, "max-ttl", 0, "quorum: enforce the delayed-restart rule for TTLs up to this (0: off): a restarted node sits out this long")
	pf.BoolVar(&nf.durable, "durable", false, "quorum with --max-ttl: declare every node appendonly yes + appendfsync always, so a restart that kept its data keeps its vote (doctor checks it)")
	root.AddCommand(newRun(&nf), newInspect(&nf), newRelease(&nf), newDoctor(&nf))
	return root
}

// addrs returns the node addresses, or a usage error: each must be
// host:port with a port from 1 to 65535.
func (nf *nodeFlags) addrs() ([]string, error) {
	var out []string
	for _, a := range strings.Split(nf.nodes, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, &exitError{exitUsage, fmt.Errorf("node %q: want host:port: %v", a, err)}
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || host == "" {
			return nil, &exitError{exitUsage, fmt.Errorf("node %q: want host:port with a port from 1 to 65535", a)}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, &exitError{exitUsage, fmt.Errorf("no nodes: give --nodes or set REDLEASE_NODES")}
	}
	return out, nil
}

// options builds go-redis options for one node. One try per command:
// go-redis's retries would turn "connection refused" into a timeout.
func (nf *nodeFlags) options(addr string) (*redis.Options, error) {
	name := clientName()
	o := &redis.Options{
		Addr: addr, Username: nf.username, Password: nf.passwordOrEnv(),
		ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1,
		// Not ClientName: go-redis fails the connection when CLIENT SETNAME
		// does, and the least-privilege user of docs/redis-acl.conf may not
		// run it. The name is a courtesy to operators, so try it and go on.
		OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			_ = cn.ClientSetName(ctx, name).Err()
			return nil
		},
	}
	if nf.tls {
		cfg, err := nf.tlsConfig(addr)
		if err != nil {
			return nil, err
		}
		o.TLSConfig = cfg
	}
	return o, nil
}

// clientName names this process's connections in CLIENT LIST.
func clientName() string {
	host, _ := os.Hostname()
	return "redlease:" + strings.ReplaceAll(host, " ", "_") + ":" + strconv.Itoa(os.Getpid())
}

func (nf *nodeFlags) passwordOrEnv() string {
	if nf.password != "" {
		return nf.password
	}
	return os.Getenv("REDLEASE_PASSWORD")
}

func (nf *nodeFlags) tlsConfig(addr string) (*tls.Config, error) {
	host := addr
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		host = addr[:i]
	}
	cfg := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if nf.tlsCA != "" {
		pem, err := os.ReadFile(nf.tlsCA)
		if err != nil {
			return nil, &exitError{exitUsage, err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &exitError{exitUsage, fmt.Errorf("%s: no PEM certificates", nf.tlsCA)}
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// connect connects to addrs; close them when done.
func (nf *nodeFlags) connect(addrs []string) ([]redis.UniversalClient, func(), error) {
	var out []redis.UniversalClient
	closeAll := func() {
		for _, c := range out {
			_ = c.Close()
		}
	}
	for _, a := range addrs {
		o, err := nf.options(a)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		out = append(out, redis.NewClient(o))
	}
	return out, closeAll, nil
}

// dataNodes returns the addresses of the nodes that hold locks: --nodes,
// or with --strategy failover the primary the Sentinels in --nodes name.
func (nf *nodeFlags) dataNodes(ctx context.Context) ([]string, error) {
	addrs, err := nf.addrs()
	if err != nil {
		return nil, err
	}
	if nf.strategy != "failover" {
		return addrs, nil
	}
	if nf.master == "" {
		return nil, &exitError{exitUsage, fmt.Errorf("failover needs --master and the Sentinels in --nodes")}
	}
	b, err := nf.failover(ctx, addrs)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	return []string{b.watcher.Primary()}, nil
}

// backend is a strategy and what it needs: the clients of its data nodes
// (for holder metadata) and a stop that closes everything.
type backend struct {
	s       redlease.Strategy
	name    string
	clients []redis.UniversalClient // the nodes that hold lock keys
	watcher *failover.Watcher       // failover only
	stop    func()
}

// strategyFor builds the strategy the flags ask for; b.stop releases what
// it holds (clients, workers, the Sentinel watcher).
func (nf *nodeFlags) strategyFor(ctx context.Context) (*backend, error) {
	name := nf.strategy
	addrs, err := nf.addrs()
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = "single"
		if len(addrs) > 1 {
			name = "quorum"
		}
	}
	switch name {
	case "single":
		if len(addrs) != 1 {
			return nil, &exitError{exitUsage, fmt.Errorf("single needs one node, got %d", len(addrs))}
		}
		cs, closeAll, err := nf.connect(addrs)
		if err != nil {
			return nil, err
		}
		s, err := single.New(cs[0])
		if err != nil {
			closeAll()
			return nil, &exitError{exitUsage, err}
		}
		return &backend{s: s, name: name, clients: cs, stop: closeAll}, nil
	case "quorum":
		cs, closeAll, err := nf.connect(addrs)
		if err != nil {
			return nil, err
		}
		opts := []quorum.Option{quorum.WithFencing(), quorum.WithNodeTimeout(nf.timeout)}
		if nf.maxTTL > 0 {
			opts = append(opts, quorum.WithDelayedRestart(nf.maxTTL))
		}
		if nf.durable {
			opts = append(opts, quorum.WithDurableNodes())
		}
		q, err := quorum.New(cs, opts...)
		if err != nil {
			closeAll()
			return nil, &exitError{exitUsage, err}
		}
		return &backend{s: q, name: name, clients: cs, stop: func() { _ = q.Close(); closeAll() }}, nil
	case "failover":
		if nf.master == "" {
			return nil, &exitError{exitUsage, fmt.Errorf("failover needs --master and the Sentinels in --nodes")}
		}
		return nf.failover(ctx, addrs)
	}
	return nil, &exitError{exitUsage, fmt.Errorf("unknown strategy %q: single, quorum or failover", name)}
}

// failover builds the failover strategy on the Sentinels at addrs and
// starts its watcher, which revokes the lock when the primary moves.
func (nf *nodeFlags) failover(ctx context.Context, addrs []string) (*backend, error) {
	o := &redis.FailoverOptions{MasterName: nf.master, SentinelAddrs: addrs, Username: nf.username,
		Password: nf.passwordOrEnv(), ContextTimeoutEnabled: true, MaxRetries: -1}
	var sentinels []*redis.SentinelClient
	for _, a := range addrs {
		so := &redis.Options{Addr: a, ContextTimeoutEnabled: true, DialTimeout: time.Second, MaxRetries: -1}
		if nf.tls {
			cfg, err := nf.tlsConfig(a)
			if err != nil {
				return nil, err
			}
			so.TLSConfig = cfg
			o.TLSConfig = cfg
		}
		sentinels = append(sentinels, redis.NewSentinelClient(so))
	}
	closeSentinels := func() {
		for _, s := range sentinels {
			_ = s.Close()
		}
	}
	c := redis.NewFailoverClient(o)
	s, err := failover.New(c, failover.WithReplicas(nf.replicas), failover.WithMaster(nf.master))
	if err != nil { // --replicas 0, a --master with a space
		_ = c.Close()
		closeSentinels()
		return nil, &exitError{exitUsage, err}
	}
	w, err := failover.NewWatcher(ctx, s, nf.master, 0, sentinels...)
	if err != nil {
		_ = c.Close()
		closeSentinels()
		if unknownMaster(err) {
			return nil, &exitError{exitUsage, fmt.Errorf("the Sentinels do not know --master %q: %w", nf.master, err)}
		}
		return nil, &exitError{exitUnavailable, err}
	}
	return &backend{s: s, name: "failover", clients: []redis.UniversalClient{c}, watcher: w,
		stop: func() { _ = w.Close(); _ = c.Close(); closeSentinels() }}, nil
}

// unknownMaster reports whether every Sentinel that failed did so with a
// reply (no such master), rather than by not answering.
func unknownMaster(err error) bool {
	var ne interface{ Unwrap() []error }
	if !errors.As(err, &ne) {
		return false
	}
	replies := 0
	for _, e := range ne.Unwrap() {
		var re redis.Error
		switch {
		case errors.Is(e, redlease.ErrUnavailable):
		case errors.As(e, &re):
			replies++
		default:
			return false
		}
	}
	return replies > 0
}
