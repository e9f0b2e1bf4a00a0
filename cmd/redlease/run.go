package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/renew"
)

func newRun(nf *nodeFlags) *cobra.Command {
	var (
		key   string
		ttl   time.Duration
		wait  time.Duration
		grace time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run --key K [flags] -- CMD [ARGS...]",
		Short: "Run a command while holding a lock (kept alive, released when the command exits)",
		Long: `run takes the lock (waiting up to --wait), keeps it alive while CMD runs, and
releases it when CMD exits. CMD gets the lock's fence in REDLEASE_FENCE (pass it
to the storage CMD writes to) and the key in REDLEASE_KEY. If the lock is lost
while CMD runs, CMD is sent SIGTERM, then SIGKILL after --grace, and run exits
76. If the lock is not obtained, run exits 75 without starting CMD. Otherwise
run exits with CMD's status.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if key == "" {
				return &exitError{exitUsage, errors.New("--key is required")}
			}
			return runLocked(c.Context(), nf, key, ttl, wait, grace, args)
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "lock key (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "lock TTL; the lock is extended every third of it")
	cmd.Flags().DurationVar(&wait, "wait", 0, "how long to wait for the lock (0: one attempt)")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "time between SIGTERM and SIGKILL when the lock is lost")
	return cmd
}

func runLocked(ctx context.Context, nf *nodeFlags, key string, ttl, wait, grace time.Duration, args []string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	s, name, stop, err := nf.strategyFor()
	if err != nil {
		return err
	}
	defer stop()
	w, err := renew.New()
	if err != nil {
		return &exitError{exitSoftware, err}
	}
	defer w.Stop()
	locker := redlease.New(s, redlease.WithTTL(ttl), redlease.WithPrefix(nf.prefix), redlease.WithKeeper(w))

	var lk *redlease.Lock
	if wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		lk, err = locker.Lock(wctx, key)
		cancel()
	} else {
		lk, err = locker.TryLock(ctx, key)
	}
	switch {
	case errors.Is(err, redlease.ErrNotObtained):
		return &exitError{exitNotObtained, fmt.Errorf("lock %q not obtained (%s): %w", key, name, err)}
	case err != nil:
		return &exitError{exitSoftware, err}
	}
	stopKeeping := w.Keep(lk)
	defer func() {
		stopKeeping()
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = lk.Release(rctx)
		cancel()
	}()

	child := exec.Command(args[0], args[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = append(os.Environ(),
		"REDLEASE_FENCE="+strconv.FormatUint(lk.Fence(), 10), "REDLEASE_KEY="+key, "REDLEASE_STRATEGY="+name)
	if err := child.Start(); err != nil {
		return &exitError{exitSoftware, err}
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	select {
	case err := <-exited:
		return childStatus(err)
	case <-lk.Lost():
		fmt.Fprintf(os.Stderr, "redlease: lock %q lost (%v): stopping the command\n", key, lk.Err())
		stopChild(child, exited, grace)
		return &exitError{exitLost, nil}
	case <-ctx.Done(): // we were told to stop: pass it on, then let go
		stopChild(child, exited, grace)
		return &exitError{128 + int(syscall.SIGTERM), nil}
	}
}

// stopChild sends SIGTERM, then SIGKILL after grace, and waits.
func stopChild(child *exec.Cmd, exited <-chan error, grace time.Duration) {
	_ = child.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		_ = child.Process.Kill()
		<-exited
	}
}

// childStatus turns the command's exit into ours.
func childStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &exitError{128 + int(ws.Signal()), nil}
		}
		return &exitError{ee.ExitCode(), nil}
	}
	return &exitError{exitSoftware, err}
}
