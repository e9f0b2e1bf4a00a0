package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// leaderArg, as the first argument, makes the binary a group leader
// (leaderMain) instead of the CLI. It is not a command users type.
const leaderArg = "__redlease-group-leader"

// parentPoll is how often the leader checks that run is still its parent,
// as a backstop for Pdeathsig (and the only check where there is none).
const parentPoll = 100 * time.Millisecond

// leaderMain is the group leader: started by run in a new process group
// (and, on Linux, with Pdeathsig), it starts the command in that group,
// reaps every descendant (on Linux it is their subreaper) and exits, once
// none is left, with the command's status (128+n if a signal killed it).
// If run dies, it kills the whole group with SIGKILL at once. Signals that
// run sends to the group while alive are the command's business: the
// leader survives them and waits.
//
// args: run's pid, "--", the command and its arguments.
func leaderMain(args []string) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintln(os.Stderr, "redlease: "+leaderArg+" is started by redlease run")
		return exitUsage
	}
	parent, err := strconv.Atoi(args[0])
	if err != nil {
		return exitUsage
	}
	args = args[2:]
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if os.Getppid() != parent { // run died before we could listen
		return exitLost
	}
	becomeSubreaper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "redlease:", err)
		return execFailure(err)
	}
	pid := cmd.Process.Pid
	status := make(chan int, 1)
	go func() { // ends when no child is left (ECHILD); the process ends with it
		code := exitSoftware
		for {
			var ws syscall.WaitStatus
			p, err := syscall.Wait4(-1, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				break
			}
			if p == pid {
				code = waitCode(ws)
			}
		}
		status <- code
	}()
	tick := time.NewTicker(parentPoll)
	defer tick.Stop()
	for {
		select {
		case code := <-status:
			return code
		case <-sigs:
		case <-tick.C:
		}
		if os.Getppid() != parent {
			// run is gone: nobody keeps the lock alive or will stop the
			// command in time. Kill the group, this process included.
			_ = syscall.Kill(0, syscall.SIGKILL)
		}
	}
}

// waitCode is a wait status as a shell reports it.
func waitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// execFailure is the exit code for a command that could not be started:
// 127 not found and 126 for any other exec failure (permission, format,
// text file busy, argument list too long), as in sh; 71 when the system
// could not fork (EX_OSERR, as flock(1) does).
func execFailure(err error) int {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return exitNotFound
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOMEM):
		return exitOSErr
	}
	return exitCannotExec
}

// groupFailure is the exit code for a group leader that could not be
// started: a system error (71: fork failed, no /proc/self/exe), or 126
// when the command's arguments and environment, with what run adds, are
// too long for exec.
func groupFailure(err error) int {
	if errors.Is(err, syscall.E2BIG) {
		return exitCannotExec
	}
	return exitOSErr
}

// group is the command's process group, as run sees it.
type group struct {
	cmd  *exec.Cmd
	pgid int
	done chan struct{} // closed once the leader has been reaped
	err  error         // the leader's Wait error; read after done
}

// startGroup starts the leader with the command, in a new process group.
func startGroup(args, env []string) (*group, error) {
	exe, err := selfExe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{leaderArg, strconv.Itoa(os.Getpid()), "--"}, args...)...)
	cmd.Args[0] = os.Args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	cmd.SysProcAttr = leaderAttr()
	g := &group{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that forked the leader ends, not
		// when the process does: keep this goroutine on its thread, so the
		// runtime cannot retire it, until the leader is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		g.err = cmd.Wait()
		close(g.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	g.pgid = cmd.Process.Pid
	return g, nil
}

// signal sends sig to every process of the group.
func (g *group) signal(sig syscall.Signal) {
	_ = syscall.Kill(-g.pgid, sig)
}

// gone reports whether no process of the group is left. Call it only after
// done: it reaps group members that were orphaned to run.
func (g *group) gone() bool {
	for {
		var ws syscall.WaitStatus
		p, err := syscall.Wait4(-g.pgid, &ws, syscall.WNOHANG, nil)
		if err != nil || p <= 0 {
			break
		}
	}
	return errors.Is(syscall.Kill(-g.pgid, 0), syscall.ESRCH)
}

// status is the leader's exit as run's exit code (the leader reports the
// command's status; 128+n if the leader itself was killed by signal n).
func (g *group) status() int {
	var ee *exec.ExitError
	if errors.As(g.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return waitCode(ws)
		}
		return ee.ExitCode()
	}
	if g.err != nil {
		return exitSoftware
	}
	return exitOK
}
