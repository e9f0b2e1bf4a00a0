package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/renew"
)

const (
	// releaseTimeout bounds the release (and the metadata's deletion).
	releaseTimeout = 5 * time.Second
	// killWait bounds the wait for the group to be gone after SIGKILL; past
	// it (a process stuck in the kernel) run exits without releasing the
	// lock, which then lapses at its TTL.
	killWait = 10 * time.Second
	// groupPoll is how often run looks for processes of the group once the
	// leader has exited.
	groupPoll = 20 * time.Millisecond
)

// runOpts are run's own flags.
type runOpts struct {
	key    string
	ttl    time.Duration
	wait   time.Duration
	grace  time.Duration
	margin time.Duration
	// recordArgs: the holder record names the whole command line, not
	// just the program.
	recordArgs bool
	// graceSet and marginSet: given on the command line (else: half the
	// loss margin, and a tenth of the TTL).
	graceSet, marginSet bool
}

// safety is how long before Until the group gets SIGKILL at the latest.
func (o runOpts) safety() time.Duration { return o.margin / 4 }

// check validates the flags and fills in the defaults.
func (o *runOpts) check() error {
	usage := func(format string, args ...any) error { return &exitError{exitUsage, fmt.Errorf(format, args...)} }
	switch {
	case o.key == "":
		return usage("--key is required")
	case o.ttl < 10*time.Millisecond:
		return usage("--ttl %v: must be at least 10ms", o.ttl)
	case o.wait < 0:
		return usage("--wait %v: must not be negative", o.wait)
	case o.grace < 0:
		return usage("--grace %v: must not be negative", o.grace)
	}
	if !o.marginSet {
		o.margin = o.ttl / redlease.DefaultLossMarginDivisor
	} else if o.margin <= 0 || o.margin >= o.ttl/2 {
		return usage("--loss-margin %v: must be more than 0 and less than half the TTL (%v)", o.margin, o.ttl/2)
	}
	if !o.graceSet {
		o.grace = o.margin / 2
	} else if limit := o.margin - o.safety(); o.grace > limit {
		return usage("--grace %v does not fit in the loss margin %v (at most %v, so that SIGKILL comes a quarter of the margin before the lock's validity ends): lower --grace or raise --loss-margin",
			o.grace, o.margin, limit)
	}
	return nil
}

func newRun(nf *nodeFlags) *cobra.Command {
	var o runOpts
	cmd := &cobra.Command{
		Use:   "run --key K [flags] -- CMD [ARGS...]",
		Short: "Run a command while holding a lock (kept alive, released once every process of the command is gone)",
		Long: `run takes the lock (waiting up to --wait), keeps it alive while CMD runs, and
releases it once CMD and every process it left in its process group are gone.
CMD gets the lock's fence in REDLEASE_FENCE (pass it to the storage CMD writes
to), the key in REDLEASE_KEY and the strategy in REDLEASE_STRATEGY.

CMD runs in a process group of its own, whose leader kills the group if run
dies. If the lock is lost while CMD runs, the group gets SIGTERM, then SIGKILL
after --grace, and at the latest a quarter of the loss margin before the lock's
validity ends (at once if the key is known to be gone); run exits 76. --grace
must fit in three quarters of the loss margin (--loss-margin, a tenth of the
TTL by default). SIGINT, SIGTERM and SIGHUP to run are passed on to the group;
run waits --grace, then sends SIGKILL, releases the lock and exits 128+signal.

Known limits: a process that leaves the group (setsid, a daemon) gets no
signal; once the group is killed (lock lost, a signal to run) run no longer
waits for it, and it may outlive the lock: do not daemonize under run. If a process of the group survives SIGKILL for 10s (stuck in the
kernel), run exits 76 without releasing and the lock lapses at its TTL.
Pass REDLEASE_FENCE to the storage CMD writes to: it refuses such late
writes.

While it holds the lock, run records beside it who holds it (host, pid,
start time and the program CMD names; inspect shows it). Anyone who can read
the lock keys can read that record: the command's arguments go into it only
with --record-args, since they may carry secrets.

While --wait runs, run says on stderr who holds the lock and how long it has
waited: on a terminal in one line redrawn every second, otherwise in a plain
line every 30s. Exit 75 names the holder too.

Exit codes:
` + exitTableText("  "),
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			o.graceSet, o.marginSet = c.Flags().Changed("grace"), c.Flags().Changed("loss-margin")
			if err := o.check(); err != nil {
				return err
			}
			return runLocked(c.Context(), nf, o, args)
		},
	}
	cmd.Flags().StringVar(&o.key, "key", "", "lock key (required)")
	cmd.Flags().DurationVar(&o.ttl, "ttl", 30*time.Second, "lock TTL; the lock is extended every third of it")
	cmd.Flags().DurationVar(&o.wait, "wait", 0, "how long to wait for the lock (0: one attempt)")
	cmd.Flags().DurationVar(&o.grace, "grace", 0, "time between SIGTERM and SIGKILL (default half the loss margin; at most three quarters of it)")
	cmd.Flags().DurationVar(&o.margin, "loss-margin", 0, "the lock counts as lost this long before its validity ends (default a tenth of the TTL; less than half of it)")
	cmd.Flags().BoolVar(&o.recordArgs, "record-args", false, "record CMD's whole command line in the holder record, not just the program (readable to anyone who can read the lock keys: no secrets in the arguments)")
	return cmd
}

// errSignal is the cause of an acquisition stopped by a signal.
var errSignal = errors.New("interrupted by a signal")

func runLocked(ctx context.Context, nf *nodeFlags, o runOpts, args []string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	// Fail as a shell would, before taking the lock, if CMD cannot run.
	if _, err := exec.LookPath(args[0]); err != nil {
		return &exitError{execFailure(err), err}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	b, err := nf.strategyFor(ctx)
	if err != nil {
		return err
	}
	defer b.stop()
	w, err := renew.New()
	if err != nil {
		return &exitError{exitSoftware, err}
	}
	defer w.Close()
	locker, err := redlease.New(b.s, redlease.WithTTL(o.ttl), redlease.WithLossMargin(o.margin),
		redlease.WithPrefix(nf.prefix), redlease.WithKeeper(w))
	if err != nil { // a --ttl or --margin the Locker refuses
		return &exitError{exitUsage, err}
	}

	fullKey := nf.prefix + o.key
	lk, sig, err := acquire(ctx, locker, o, sigs, func(ctx context.Context) string {
		return describeHolder(ctx, b.clients, fullKey)
	})
	if sig != 0 {
		if lk != nil {
			rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			_ = lk.Release(rctx)
			cancel()
		}
		return &exitError{exitSignalBase + int(sig), fmt.Errorf("%v before the lock was taken; the command did not run", sig)}
	}
	switch {
	case errors.Is(err, redlease.ErrInvalid):
		return &exitError{exitUsage, err}
	case errors.Is(err, redlease.ErrDenied):
		return deniedExit(fmt.Sprintf("lock %q (%s)", o.key, b.name), err)
	case errors.Is(err, redlease.ErrUnavailable):
		return &exitError{exitUnavailable, redlease.Wrap(fmt.Errorf("lock %q (%s)", o.key, b.name), err)}
	case errors.Is(err, redlease.ErrNotObtained):
		who := describeHolder(ctx, b.clients, fullKey)
		return &exitError{exitNotObtained, redlease.Wrap(fmt.Errorf("lock %q held by %s (%s)", o.key, who, b.name), err)}
	case err != nil:
		return &exitError{exitUnavailable, err}
	}
	stopKeeping := w.Keep(lk)
	meta := keepHolder(b.clients, fullKey, lk, recordedCommand(args, o.recordArgs))
	release := func() {
		meta.stop(releaseTimeout)
		stopKeeping()
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		_ = lk.Release(rctx)
		cancel()
	}

	becomeSubreaper() // orphans of a leader that died come to run, which reaps them
	env := append(os.Environ(), "REDLEASE_FENCE="+strconv.FormatUint(lk.Fence(), 10),
		"REDLEASE_KEY="+o.key, "REDLEASE_STRATEGY="+b.name)
	g, err := startGroup(args, env)
	if err != nil {
		release()
		return &exitError{groupFailure(err), fmt.Errorf("starting the command's process group: %w", err)}
	}
	afterGroupStart()
	res := supervise(g, lk, o, sigs)
	res.flush()
	if !res.gone {
		// Do not release: a process of the group may still act. The key
		// lapses at its TTL.
		meta.cancel()
		meta.wg.Wait()
		stopKeeping()
		return &exitError{exitLost, fmt.Errorf("lock %q: processes of group %d still running %v after SIGKILL; the lock was not released", o.key, g.pgid, killWait)}
	}
	release()
	switch {
	case res.lost:
		return &exitError{exitLost, nil}
	case res.sig != 0:
		return &exitError{exitSignalBase + int(res.sig), nil}
	case res.status != 0:
		return &exitError{res.status, nil}
	}
	return nil
}

// recordedCommand is what the holder record says run runs: the program, or
// with all the whole command line.
func recordedCommand(args []string, all bool) []string {
	if all {
		return args
	}
	return args[:1]
}

// acquire takes the lock; a signal stops it and is returned. While --wait
// runs it tells on stderr who holds the lock (who) and how long it waited.
func acquire(ctx context.Context, locker *redlease.Locker, o runOpts, sigs <-chan os.Signal,
	who func(context.Context) string) (*redlease.Lock, syscall.Signal, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		got  syscall.Signal
		wg   sync.WaitGroup
		done = make(chan struct{})
	)
	wg.Go(func() {
		select {
		case s := <-sigs:
			got = s.(syscall.Signal)
			cancel(errSignal)
		case <-done:
		}
	})
	var (
		lk  *redlease.Lock
		err error
	)
	if o.wait > 0 {
		wctx, wcancel := context.WithTimeout(ctx, o.wait)
		stopNote := startWaitNote(os.Stderr, stderrIsTerminal(), o.key, o.wait, who)
		lk, err = locker.Lock(wctx, o.key)
		stopNote()
		wcancel()
	} else {
		lk, err = locker.TryLock(ctx, o.key)
	}
	close(done)
	wg.Wait()
	return lk, got, err
}

// outcome is how the command's group ended.
type outcome struct {
	status int             // the leader's exit code (the command's status)
	lost   bool            // the lock was lost meanwhile
	sig    syscall.Signal  // the first signal run got and passed on; 0: none
	gone   bool            // no process of the group is left
	said   <-chan struct{} // closed once the loss line is written; nil: none
}

// say writes line to stderr from a goroutine of its own, so that the
// supervision loop never waits on stderr: a stderr nobody reads (a full
// log pipe) would otherwise hold back the SIGKILL that keeps a group
// ignoring SIGTERM from outliving the lock. The returned channel closes
// when the write returned; a write that never returns ends with the
// process (run waits for it at most sayWait, see outcome.flush).
func say(line string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.WriteString(os.Stderr, line)
	}()
	return done
}

// sayWait bounds how long run waits for a line of say before it exits.
const sayWait = time.Second

// flush waits (at most sayWait) for the line supervise wrote, if any, so
// that it is out before run exits.
func (res outcome) flush() {
	if res.said == nil {
		return
	}
	t := time.NewTimer(sayWait)
	defer t.Stop()
	select {
	case <-res.said:
	case <-t.C:
	}
}

// supervise waits until every process of the group is gone, stopping the
// group when the lock is lost or run is told to stop.
func supervise(g *group, lk *redlease.Lock, o runOpts, sigs <-chan os.Signal) outcome {
	var (
		res       outcome
		lost      = lk.Lost()
		leader    = g.done
		killT     *time.Timer
		killC     <-chan time.Time
		killAt    time.Time
		killed    bool
		giveUp    time.Time
		pollT     *time.Ticker
		pollC     <-chan time.Time
		leaderOut bool
	)
	defer func() {
		if killT != nil {
			killT.Stop()
		}
		if pollT != nil {
			pollT.Stop()
		}
	}()
	// killBy schedules SIGKILL for the group no later than at.
	killBy := func(at time.Time) {
		if killed || (killT != nil && !at.Before(killAt)) {
			return
		}
		killAt = at
		d := max(time.Until(at), 0)
		if killT == nil {
			killT = time.NewTimer(d)
			killC = killT.C
		} else {
			killT.Reset(d)
		}
	}
	for {
		select {
		case <-lost:
			lost = nil
			res.lost = true
			cause := lk.Err()
			g.signal(syscall.SIGTERM)
			at := time.Now().Add(o.grace)
			if limit := lk.Until().Add(-o.safety()); limit.Before(at) {
				at = limit
			}
			if errors.Is(cause, redlease.ErrNotHeld) || errors.Is(cause, failover.ErrFailover) {
				at = time.Now() // the key is gone or may be: someone else may hold it now
			}
			killBy(at)
			res.said = say(fmt.Sprintf("redlease: lock %q lost (%v): stopping the command's process group\n", o.key, cause))
		case s := <-sigs:
			sig := s.(syscall.Signal)
			if res.sig == 0 {
				res.sig = sig
			}
			g.signal(sig)
			killBy(time.Now().Add(o.grace))
		case <-killC:
			killC = nil
			killed = true
			giveUp = time.Now().Add(killWait)
			g.signal(syscall.SIGKILL)
		case <-leader:
			leader = nil
			leaderOut = true
			res.status = g.status()
			if g.gone() {
				res.gone = true
				return res
			}
			pollT = time.NewTicker(groupPoll)
			pollC = pollT.C
		case <-pollC:
			if leaderOut && g.gone() {
				res.gone = true
				return res
			}
			if killed && time.Now().After(giveUp) {
				return res
			}
		}
		if killed && pollC == nil {
			// The leader may be stuck too: bound the wait from here.
			pollT = time.NewTicker(groupPoll)
			pollC = pollT.C
		}
	}
}
