// Package redistest starts real redis-server processes on free loopback ports
// for tests and benchmarks, and stops them when the test ends.
//
// Everything here binds to 127.0.0.1 only. Processes are started with
// Pdeathsig, so they die with the test binary even if cleanup never runs.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/script"
)

// TB is the part of testing.TB the harness needs; *testing.T and *testing.B
// satisfy it.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	TempDir() string
}

var _ TB = (testing.TB)(nil)

// Config describes one server. The zero value is a plain in-memory node.
type Config struct {
	// Persist turns on an append-only file with fsync on every write, so a
	// restart keeps every acknowledged write.
	Persist bool
	// Cluster starts the node in cluster mode and assigns it every slot: a
	// one-node cluster, enough to see CROSSSLOT errors a multi-key script
	// would get on a real cluster.
	Cluster bool
	// Args are extra redis-server arguments ("--maxmemory", "1mb", ...).
	Args []string
}

// Server is one redis-server process owned by a test.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int

	tb   TB
	cfg  Config
	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current process has exited
	// killed: the current process was sent SIGKILL by Kill. An exit
	// without it (a crash, a signal from elsewhere) is recorded in
	// unexpected and logged at cleanup with the log's tail.
	killed     bool
	unexpected []string
}

// Binary returns the redis-server path, or fails the test with a clear
// message (run `make test`, which installs it, or apt-get install
// redis-server).
func Binary(tb TB) string {
	tb.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server not found on PATH: run `make test` (it installs redis-server with apt-get as root) or install it yourself: %v", err)
	}
	return p
}

// Start starts one server and registers its stop with tb.Cleanup.
func Start(tb TB, cfg Config) *Server {
	tb.Helper()
	bin := Binary(tb)
	s := &Server{tb: tb, cfg: cfg, dir: tb.TempDir()}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; try a few
		port, err := freePort()
		if err != nil {
			tb.Fatalf("redistest: no free port: %v", err)
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.launch(bin); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		tb.Fatalf("redistest: start redis-server: %v", lastErr)
	}
	tb.Cleanup(func() {
		s.Kill()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, u := range s.unexpected {
			tb.Logf("redistest: %s", u)
		}
	})
	if cfg.Cluster {
		s.makeCluster()
	}
	return s
}

// StartN starts n plain servers.
func StartN(tb TB, n int, cfg Config) []*Server {
	tb.Helper()
	servers := make([]*Server, n)
	for i := range servers {
		servers[i] = Start(tb, cfg)
	}
	return servers
}

func (s *Server) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--protected-mode", "no",
		"--save", "",
		"--enable-debug-command", "local",
		// A replica's first sync would otherwise wait 5 s for more replicas.
		"--repl-diskless-sync-delay", "0",
	}
	if s.cfg.Persist {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.cfg.Cluster {
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"))
	}
	return append(a, s.cfg.Args...)
}

// launch starts the process and waits until it answers PING (5 s at most).
func (s *Server) launch(bin string) error {
	cmd := exec.Command(bin, s.args()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		if s.cmd == cmd && !s.killed {
			s.unexpected = append(s.unexpected, fmt.Sprintf("%s: redis-server (pid %d) exited on its own at %s: %v; its log ends: %s",
				s.Addr, cmd.Process.Pid, time.Now().Format("15:04:05.000"), err, s.logTail()))
		}
		s.mu.Unlock()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.killed = cmd, done, false
	s.mu.Unlock()

	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		pid, err := serverPID(ctx, c)
		cancel()
		if err == nil && pid != cmd.Process.Pid {
			// Another redis-server holds the port (another test's, which
			// took it between freePort and this bind): ours exits, and
			// the answer is not ours. Taking it for ours would have this
			// test drive, kill or restart a server it does not own.
			s.Kill()
			return fmt.Errorf("redis-server on %s: process %d answered, not the one just started (%d): the port belongs to another server", s.Addr, pid, cmd.Process.Pid)
		}
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited at start: %s", s.Addr, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server on %s not answering after 5s: %v", s.Addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverPID is the process_id that c's server gives in INFO server.
func serverPID(ctx context.Context, c *redis.Client) (int, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	return infoPID(info)
}

// infoPID is the process_id in an INFO server reply.
func infoPID(info string) (int, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("redistest: no process_id in INFO server")
}

// makeCluster assigns every slot to this node and waits for cluster_state:ok.
func (s *Server) makeCluster() {
	s.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		s.tb.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on %s: %v", s.Addr, err)
	}
	for range 500 {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: cluster on %s never reached cluster_state:ok", s.Addr)
}

// Client returns a client for this server, closed on cleanup. It has
// ContextTimeoutEnabled, so context deadlines bound socket reads too, and
// go-redis's default retries.
func (s *Server) Client() *redis.Client { return newClient(s.tb, s.Addr) }

// newClient returns a client for addr, with ContextTimeoutEnabled, closed
// on tb's cleanup.
func newClient(tb TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill sends SIGKILL (a crash: nothing is flushed) and waits for the
// process to exit. Killing a dead server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.killed = cmd != nil // the current process's exit is ours
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Pause stops the process with SIGSTOP: it keeps its connections open and
// its port bound but answers nothing, like a long GC pause or a VM freeze.
// Key expiry stops too, since it runs on the server's event loop.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart kills the server and starts it again on the same port. Without
// Persist the new process has lost every key (an amnesiac node); with it,
// the append-only file brings the acknowledged writes back.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	var err error
	for range 50 { // the port can linger for a moment after the kill
		if err = s.launch(Binary(s.tb)); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: restart %s: %v", s.Addr, err)
}

// Alive reports whether the process is running (paused counts as running).
func (s *Server) Alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *Server) logTail() string {
	f, err := os.Open(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 5 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, " | ")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return addr.Port, nil
}

// QuietClientLogs silences go-redis's process-wide logger, which otherwise
// prints a line for every refused dial while a test has nodes down. Call it
// from TestMain only: it changes global state of go-redis.
func QuietClientLogs() { redis.SetLogger(quiet{}) }

type quiet struct{}

// Printf discards the line.
func (quiet) Printf(context.Context, string, ...any) {}

// StartCluster starts n cluster-mode servers and joins them into one
// cluster of n masters (redis-cli --cluster create), waiting until every
// node reports cluster_state:ok.
func StartCluster(tb TB, n int) []*Server {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatalf("redis-cli not found on PATH (Debian package redis-tools, installed with redis-server): %v", err)
	}
	servers := make([]*Server, n)
	args := []string{"--cluster", "create"}
	for i := range servers {
		servers[i] = startClusterNode(tb)
		args = append(args, servers[i].Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v: %s", err, out)
	}
	for _, s := range servers {
		waitClusterOK(tb, s)
	}
	return servers
}

// startClusterNode starts one cluster-mode server that belongs to no
// cluster yet, stopped by tb.Cleanup.
func startClusterNode(tb TB) *Server {
	tb.Helper()
	s := &Server{tb: tb, cfg: Config{Cluster: true}, dir: tb.TempDir()}
	var lastErr error
	for range 5 {
		port, perr := freePort()
		if perr != nil {
			tb.Fatalf("redistest: no free port: %v", perr)
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.launch(Binary(tb)); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		tb.Fatalf("redistest: start cluster node: %v", lastErr)
	}
	tb.Cleanup(s.Kill)
	return s
}

// waitClusterOK waits (5 s at most) until s reports cluster_state:ok.
func waitClusterOK(tb TB, s *Server) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	for range 500 {
		info, err := c.ClusterInfo(context.Background()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("redistest: cluster node %s never reached cluster_state:ok (waited 5s)", s.Addr)
}

// ClusterClient returns a Cluster client for servers, closed on cleanup.
func ClusterClient(tb TB, servers []*Server) *redis.ClusterClient {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(tb TB) int {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatalf("redistest: no free port: %v", err)
	}
	return p
}

// AgeBootMarker sets c's boot marker (quorum's delayed-restart rule) as if
// a client had first seen the running server process age ago: the node
// votes at once. It is how a test says "these nodes have been up for
// long" without waiting.
func AgeBootMarker(ctx context.Context, c redis.UniversalClient, age time.Duration) error {
	now, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	var runID string
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			runID = v
		}
	}
	if runID == "" {
		return fmt.Errorf("redistest: no run_id in INFO server")
	}
	return c.Set(ctx, script.BootMarker, script.Marker(now.Add(-age).UnixMilli(), runID), 0).Err()
}

// Unaccepted returns how many connections to the server wait in its
// listening socket's accept queue: made by the kernel, not yet taken by
// redis-server. A paused server (Pause) takes none, so a client that dials
// it shows here once its connection is made, and is then inside its
// handshake, waiting for a reply that will not come until Resume. Linux
// only (it reads /proc/net/tcp); elsewhere it returns an error.
func (s *Server) Unaccepted() (int, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	local := fmt.Sprintf("0100007F:%04X", s.Port) // 127.0.0.1:port, as the kernel prints it
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		// sl local_address rem_address st tx_queue:rx_queue ...; st 0A is
		// LISTEN, whose rx_queue is the accept queue's length.
		if len(f) < 5 || f[1] != local || f[3] != "0A" {
			continue
		}
		_, rx, ok := strings.Cut(f[4], ":")
		if !ok {
			return 0, fmt.Errorf("redistest: /proc/net/tcp: queue field %q", f[4])
		}
		n, err := strconv.ParseInt(rx, 16, 64)
		return int(n), err
	}
	return 0, fmt.Errorf("redistest: no listening socket on %s in /proc/net/tcp", s.Addr)
}

// DownAddr returns a loopback address where no server is, for as long as
// the test runs: a connection to it is refused. A port that was merely
// free a moment ago (FreePort) is no down node: another test's server,
// started meanwhile by this process or another, may take it and answer.
// DownAddr holds the port with a socket bound to it that never listens,
// without SO_REUSEADDR, so no server can bind it, and closes that socket
// on tb's cleanup.
func DownAddr(tb TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("redistest: socket: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		tb.Fatalf("redistest: bind a down port: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		tb.Fatalf("redistest: getsockname: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
