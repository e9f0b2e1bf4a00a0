package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/inspect"
	"github.com/redlease/redlease/internal/script"
)

// How often run tells, while --wait runs, who holds the lock and how long
// it has waited: on a terminal a line redrawn in place every ttyEvery; on
// anything else (a log, a pipe) a plain line every plainEvery, never "\r".
const (
	ttyEvery   = time.Second
	plainEvery = 30 * time.Second
	// holderLookup bounds one question to the nodes about the holder.
	holderLookup = 500 * time.Millisecond
)

// describeHolder says who holds fullKey, asking every node at once (within
// holderLookup): the host, pid, command and start time run recorded; a
// token when the holder left no record (a library client); "nobody" when
// no node that answered holds it.
func describeHolder(ctx context.Context, clients []redis.UniversalClient, fullKey string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holderLookup)
	defer cancel()
	views := make([]nodeView, len(clients))
	if script.CheckKey(fullKey) == nil { // run refuses the others before it waits
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				nv, err := inspect.Read(ctx, c, fullKey)
				nv.Err = err
				views[i] = nodeViewOf(nv)
			})
		}
		wg.Wait()
	}
	token, answered := "", 0
	for _, v := range views {
		switch {
		case v.Holder != nil:
			h := v.Holder
			return fmt.Sprintf("host %s pid %d (%s, since %s)", h.Host, h.PID, h.Command, h.Start)
		case v.State == "held" && token == "":
			token = v.Token
		}
		if v.State == "held" || v.State == "free" {
			answered++
		}
	}
	switch {
	case token != "":
		return "token " + short(token) + " (no holder record: not taken by redlease run)"
	case answered == 0:
		return "an unknown holder (no node answered the question)"
	}
	return "nobody at the moment"
}

// waitNote tells the user, on w, while run waits for a lock, who holds it
// and for how long run has waited.
type waitNote struct {
	w    io.Writer
	tty  bool
	key  string
	wait time.Duration
	who  func(context.Context) string

	done   chan struct{}
	exited chan struct{}
	drawn  bool // tty: a line is on screen
}

// startWaitNote starts telling (ttyEvery on a terminal, plainEvery on
// anything else) until the returned stop, which clears a line drawn on a
// terminal. stop waits for a write in progress at most sayWait: a stderr
// nobody reads must not hold run back.
func startWaitNote(w io.Writer, tty bool, key string, wait time.Duration, who func(context.Context) string) (stop func()) {
	n := &waitNote{w: w, tty: tty, key: key, wait: wait, who: who, done: make(chan struct{}), exited: make(chan struct{})}
	go n.loop(time.Now())
	return func() {
		close(n.done)
		t := time.NewTimer(sayWait)
		defer t.Stop()
		select {
		case <-n.exited:
		case <-t.C:
		}
	}
}

func (n *waitNote) loop(start time.Time) {
	defer close(n.exited)
	every := plainEvery
	if n.tty {
		every = ttyEvery
		n.tell(start) // at once: a person is watching
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			if n.drawn {
				_, _ = io.WriteString(n.w, "\r\x1b[K")
			}
			return
		case <-t.C:
			n.tell(start)
		}
	}
}

// tell writes one note: who holds the key, how long run has waited.
func (n *waitNote) tell(start time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-n.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	who := n.who(ctx)
	cancel()
	select {
	case <-n.done: // the wait ended meanwhile: nothing to tell
		return
	default:
	}
	_, _ = io.WriteString(n.w, n.line(who, time.Since(start)))
	n.drawn = n.tty
}

// line is one note: redrawn in place on a terminal, a plain line otherwise.
func (n *waitNote) line(who string, waited time.Duration) string {
	text := fmt.Sprintf("redlease: waiting for lock %q held by %s: %v of --wait %v", n.key, who, waited.Round(time.Second), n.wait)
	if n.tty {
		return "\r" + text + "\x1b[K"
	}
	return text + "\n"
}

// stderrIsTerminal reports whether stderr is a terminal (see isTerminal).
func stderrIsTerminal() bool { return isTerminal(os.Stderr.Fd()) }
