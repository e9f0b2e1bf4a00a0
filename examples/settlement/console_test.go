package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// output runs f with os.Stdout on a pipe and returns what f printed.
func output(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = saved }()
	got := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		got <- string(b)
	}()
	f()
	_ = w.Close()
	return <-got
}

// Not on a terminal (a pipe, a CI log): plain lines, never a carriage
// return; on a terminal: one status line redrawn in place.
func TestConsoleWritesPlainLinesIntoAPipe(t *testing.T) {
	if stdoutIsTerminal() {
		t.Log("go test's stdout is a terminal here")
	}
	status := func() string { return "sent 1   applied 1/1" }
	plain := output(t, func() {
		c := &console{}
		stop := c.progress(status)
		c.event("an event %d", 1)
		stop()
	})
	if strings.Contains(plain, "\r") {
		t.Errorf("a carriage return into a pipe: %q", plain)
	}
	// The event, and the status line at stop (and every plainEvery
	// before it, on a machine slow enough).
	events := 0
	for _, l := range strings.Split(strings.TrimSuffix(plain, "\n"), "\n") {
		switch l {
		case "an event 1":
			events++
		case status():
		default:
			t.Errorf("unexpected line %q in %q", l, plain)
		}
	}
	if events != 1 || !strings.HasSuffix(plain, status()+"\n") {
		t.Errorf("want the event once and the status line last, got %q", plain)
	}

	tty := output(t, func() {
		c := &console{tty: true}
		stop := c.progress(status)
		stop()
	})
	if !strings.HasPrefix(tty, "\r") || strings.Count(tty, "\n") != 1 {
		t.Errorf("on a terminal: a line redrawn with \\r and ended once, got %q", tty)
	}
}
