package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
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
	}
	pf := root.PersistentFlags()
	pf.StringVar(&nf.nodes, "nodes", os.Getenv("REDLEASE_NODES"), "comma-separated host:port of the Redis nodes (default $REDLEASE_NODES); Sentinels with --strategy failover")
	pf.StringVar(&nf.username, "user", os.Getenv("REDLEASE_USER"), "ACL user (default $REDLEASE_USER)")
	pf.StringVar(&nf.password, "password", "", "password (default $REDLEASE_PASSWORD; prefer the variable, flags show in ps)")
	pf.BoolVar(&nf.tls, "tls", false, "connect with TLS")
	pf.StringVar(&nf.tlsCA, "tls-ca", "", "PEM file of the CA that signed the nodes' certificates (default: the system pool)")
	pf.StringVar(&nf.prefix, "prefix", "lock:", "key prefix")
	pf.StringVar(&nf.strategy, "strategy", "", "single, quorum or failover (default: single for one node, quorum with fencing for several)")
	pf.StringVar(&nf.master, "master", "", "Sentinel master name (--strategy failover)")
	pf.DurationVar(&nf.timeout, "node-timeout", quorum.DefaultNodeTimeout, "quorum: how long one round waits for the nodes")
	pf.IntVar(&nf.replicas, "replicas", failover.DefaultReplicas, "failover: replicas that must acknowledge each write")
	pf.DurationVar(&nf.maxTTL, "max-ttl", 0, "quorum: enforce the delayed-restart rule for TTLs up to this (0: off): a restarted node sits out this long")
	pf.BoolVar(&nf.durable, "durable", false, "quorum with --max-ttl: declare every node appendonly yes + appendfsync always, so a restart that kept its data keeps its vote (doctor checks it)")
	root.AddCommand(newRun(&nf), newInspect(&nf), newDoctor(&nf))
	return root
}

// addrs returns the node addresses, or a usage error.
func (nf *nodeFlags) addrs() ([]string, error) {
	var out []string
	for _, a := range strings.Split(nf.nodes, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, &exitError{exitUsage, fmt.Errorf("no nodes: give --nodes or set REDLEASE_NODES")}
	}
	return out, nil
}

// options builds go-redis options for one node.
func (nf *nodeFlags) options(addr string) (*redis.Options, error) {
	o := &redis.Options{
		Addr: addr, Username: nf.username, Password: nf.passwordOrEnv(),
		ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: time.Second,
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

// clients connects to every node; close them when done.
func (nf *nodeFlags) clients() ([]redis.UniversalClient, func(), error) {
	addrs, err := nf.addrs()
	if err != nil {
		return nil, nil, err
	}
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

// strategy builds the strategy the flags ask for; stop releases what it
// holds (clients, workers).
func (nf *nodeFlags) strategyFor() (s redlease.Strategy, name string, stop func(), err error) {
	name = nf.strategy
	addrs, err := nf.addrs()
	if err != nil {
		return nil, "", nil, err
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
			return nil, "", nil, &exitError{exitUsage, fmt.Errorf("single needs one node, got %d", len(addrs))}
		}
		cs, closeAll, err := nf.clients()
		if err != nil {
			return nil, "", nil, err
		}
		return single.New(cs[0]), name, closeAll, nil
	case "quorum":
		cs, closeAll, err := nf.clients()
		if err != nil {
			return nil, "", nil, err
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
			return nil, "", nil, &exitError{exitUsage, err}
		}
		return q, name, func() { _ = q.Close(); closeAll() }, nil
	case "failover":
		if nf.master == "" {
			return nil, "", nil, &exitError{exitUsage, fmt.Errorf("failover needs --master and the Sentinels in --nodes")}
		}
		o := &redis.FailoverOptions{MasterName: nf.master, SentinelAddrs: addrs, Username: nf.username,
			Password: nf.passwordOrEnv(), ContextTimeoutEnabled: true}
		if nf.tls {
			cfg, err := nf.tlsConfig(addrs[0])
			if err != nil {
				return nil, "", nil, err
			}
			o.TLSConfig = cfg
		}
		c := redis.NewFailoverClient(o)
		return failover.New(c, failover.WithReplicas(nf.replicas)), name, func() { _ = c.Close() }, nil
	}
	return nil, "", nil, &exitError{exitUsage, fmt.Errorf("unknown strategy %q: single, quorum or failover", name)}
}
