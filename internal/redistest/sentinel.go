package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a server that replicates primary and waits until the
// primary sees it acknowledge writes.
func StartReplica(tb TB, primary *Server, cfg Config) *Server {
	tb.Helper()
	return StartReplicaVia(tb, primary, primary.Addr, cfg)
}

// StartReplicaVia starts a replica of primary that connects to it through
// via (a proxy's address), so that its replication link can be faulted on
// its own.
func StartReplicaVia(tb TB, primary *Server, via string, cfg Config) *Server {
	tb.Helper()
	host, port, err := net.SplitHostPort(via)
	if err != nil {
		tb.Fatalf("redistest: replica via %q: %v", via, err)
	}
	cfg.Args = append(append([]string{}, cfg.Args...), "--replicaof", host, port)
	r := Start(tb, cfg)
	// Linked, as the primary sees it: a write there is acknowledged.
	c := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer c.Close()
	ctx := context.Background()
	for range 500 {
		pipe := c.Pipeline()
		pipe.Set(ctx, "redistest:replica-probe", r.Addr, 0)
		wait := pipe.Do(ctx, "WAIT", 1, 20)
		_, _ = pipe.Exec(ctx)
		if n, err := wait.Int64(); err == nil && n >= 1 {
			_ = c.Del(ctx, "redistest:replica-probe").Err()
			return r
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("redistest: replica %s never linked to %s", r.Addr, primary.Addr)
	return nil
}

// Sentinel is one redis-sentinel process owned by a test.
type Sentinel struct {
	Addr string
	Port int
}

// StartSentinels starts n Sentinels monitoring primary under master, with
// quorum q and down-after-milliseconds downAfter, each with its own
// writable config file in a temp dir (Sentinel rewrites it).
func StartSentinels(tb TB, primary *Server, master string, n, q int, downAfter time.Duration) []*Sentinel {
	tb.Helper()
	return StartSentinelsAt(tb, primary.Addr, master, n, q, downAfter)
}

// StartSentinelsAt is StartSentinels monitoring the primary at addr (a
// proxy in front of it, say).
func StartSentinelsAt(tb TB, addr, master string, n, q int, downAfter time.Duration) []*Sentinel {
	tb.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatalf("redistest: sentinel target %q: %v", addr, err)
	}
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		tb.Fatalf("redis-sentinel not found on PATH: run `make test` (it installs it with apt-get as root) or install redis-sentinel: %v", err)
	}
	out := make([]*Sentinel, n)
	for i := range out {
		out[i] = startSentinel(tb, bin, host, port, master, q, downAfter)
	}
	return out
}

func startSentinel(tb TB, bin, host, primaryPort, master string, q int, downAfter time.Duration) *Sentinel {
	tb.Helper()
	dir := tb.TempDir()
	for range 5 {
		port, err := freePort()
		if err != nil {
			tb.Fatalf("redistest: no free port: %v", err)
		}
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile %s
sentinel monitor %s %s %s %d
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s 3000
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "sentinel.log"), master, host, primaryPort, q, master, downAfter.Milliseconds(), master, master)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			tb.Fatalf("redistest: write sentinel config: %v", err)
		}
		cmd := exec.Command(bin, conf)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			tb.Fatalf("redistest: start redis-sentinel: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		s := &Server{tb: tb, dir: dir, cmd: cmd, done: done, Port: port,
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		up := false
		for range 250 {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			info := redis.NewStringCmd(ctx, "info", "server")
			err := c.Process(ctx, info)
			cancel()
			if err == nil {
				// The answer must be this process's: a sentinel that could
				// not bind a port another server took has exited, and the
				// other one answers (see Server.launch).
				if pid, perr := infoPID(info.Val()); perr != nil || pid != cmd.Process.Pid {
					s.Kill()
					break
				}
				up = true
				break
			}
			select {
			case <-done:
			default:
				time.Sleep(20 * time.Millisecond)
				continue
			}
			break
		}
		_ = c.Close()
		if up {
			tb.Cleanup(s.Kill)
			return &Sentinel{Addr: s.Addr, Port: port}
		}
		s.Kill()
	}
	tb.Fatalf("redistest: redis-sentinel would not start")
	return nil
}

// Client returns a Sentinel client for this Sentinel, closed on cleanup.
func (s *Sentinel) Client(tb TB) *redis.SentinelClient {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Addrs returns the addresses of sentinels.
func Addrs(sentinels []*Sentinel) []string {
	out := make([]string, len(sentinels))
	for i, s := range sentinels {
		out[i] = s.Addr
	}
	return out
}
