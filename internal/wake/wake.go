// Package wake tells waiting lock calls that a key was released, over one
// shared subscription connection per Redis client per process.
//
// The release script publishes on the key's wake channel (script.Channel)
// in the same atomic step as its delete. A waiter subscribes to that
// channel with Set.Watch before it checks the key again, and Watch returns
// only once the server confirmed the subscription (or failed it, or the
// caller's bound passed): a release the server applies after the waiter's
// check is then published after the subscription, and reaches the waiter.
// Sending SUBSCRIBE is not enough — a release between the send and the
// server's processing of it would be missed (Redisson's issue 1763).
//
// A message wakes one waiter of the process, not all (see entry.pickLocked):
// fair mode's release names the line's head, which is woken if it is
// here; otherwise the process's longest-waiting waiter is. A waiter that
// leaves without answering its notice hands it to the next. A release
// with an empty line names itself (ReleaseMark and its token), so that
// the pushes of one release from every node of a quorum wake one waiter:
// the later ones tell that waiter again while it waits, and nobody once it
// has left.
//
// Every waiter of the process on one client shares one go-redis PubSub
// (one connection), whatever the key and whatever strategy asked: a hub.
// A hub has two goroutines, a reader (messages, confirmations, errors) and
// a writer (SUBSCRIBE and UNSUBSCRIBE, so that no waiter ever blocks on a
// dial or a write to a hung node). A channel is unsubscribed when its last
// waiter leaves; a hub whose channels are all gone closes its PubSub and
// both goroutines end. Set.Close, the strategy's Close, ends the
// subscriptions that strategy made and waits, for as long as the strategy
// gives it, for the hubs it leaves idle.
//
// Notices are hints. A notice that is lost (the connection broke, the
// node is down or paused, an ACL refused the PUBLISH or the SUBSCRIBE, a
// holder released through an older client) costs the waiter its backoff,
// which Locker.Lock still runs; a broken connection also wakes every
// waiter on it at once, and again when go-redis has resubscribed, since
// releases may have been lost in between. Nothing here decides a grant.
package wake

import (
	"context"
	"errors"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/backoff"
)

// ErrClosed is Watch's error after Close.
var ErrClosed = errors.New("wake: closed")

// mu guards the registry and the state of every hub, entry and Sub. One
// mutex for the process: it is held only for map updates and sends that
// never block.
var (
	mu   sync.Mutex
	hubs = map[any]*hub{} // by client (or a Set-private key for clients that are not comparable)
	seq  uint64           // the last Sub's seq
	// hubCount is len(hubs), stored under mu and read without it (Idle).
	hubCount atomic.Int64
)

// Bounds of the hub's goroutines.
const (
	// readTimeout bounds one read of the subscription connection; a
	// timeout only means nothing came.
	readTimeout = time.Second
	// writeTimeout bounds one SUBSCRIBE or UNSUBSCRIBE call (a dial
	// included).
	writeTimeout = 5 * time.Second
	// retryMin and retryMax bound the pause after a failed read (a node
	// down: every read is a refused dial), doubling in between.
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
	// linger is how long a hub without channels keeps its connection
	// for the next waiter before it stops: on a hot key one waiter
	// leaves as the next arrives, and a new connection per wait would
	// cost a dial and a handshake per node. Close does not wait for it.
	linger = 100 * time.Millisecond
)

// hub is one client's shared subscription.
type hub struct {
	key   any
	ps    *redis.PubSub
	chans map[string]*entry
	// pending are the SUBSCRIBE commands sent whose replies have not all
	// come, in order, each with its channels in order: the server confirms
	// each channel of a command, but refuses the whole command with one
	// error reply (NOPERM), which is charged to every channel of it.
	pending [][]string
	// unsubs counts UNSUBSCRIBEs sent whose reply has not come: a
	// "subscribe" reply for such a channel is an older one, and the
	// channel will not be subscribed once the UNSUBSCRIBE lands.
	unsubs   map[string]int
	stopping bool
	kick     chan struct{} // buffer of one: the writer has work
	flush    chan struct{} // buffer of one: stop now if idle, without lingering (Close)
	stop     chan struct{} // closed when the hub stops (under mu)
	readDone chan struct{} // closed when the reader has ended
	done     chan struct{} // closed when both goroutines have ended
}

// entry is one channel on one hub.
type entry struct {
	channel     string
	subs        map[*Sub]struct{}
	sent        bool  // SUBSCRIBE handed to go-redis (which resubscribes on every reconnect)
	confirmed   bool  // the server confirmed it, and the connection has not broken since
	err         error // why it is not confirmed, once something failed
	interrupted bool  // it was confirmed, then the connection broke
	// heard are the last releases heard on the channel that woke a
	// waiter, recorded on every entry of that waiter (one per hub), so
	// that another node's push of the same release finds it on any of
	// them; next is where the next one goes.
	heard     [heardKept]heardRelease
	heardNext int
}

// Sub is one waiter's subscription to one channel on every client of a
// Set.
type Sub struct {
	set *Set
	// id is the waiter's id in the key's line (fair mode), "" for a
	// waiter served without fairness; seq orders the process's waiters by
	// arrival (see pick).
	id       string
	seq      uint64
	notify   chan struct{} // buffer of one: a release was heard (or may have been missed)
	progress chan struct{} // buffer of one: an entry was confirmed or failed
	hubs     []*hub
	entries  []*entry
	removed  bool
	// Undo notices (UndoNotice) are passed on after a pause that doubles
	// with each one since the last release notice: pause is the timer of
	// the one on its way (nil: none), undos how many came.
	pause  *time.Timer
	undos  int
	jitter *backoff.Stream // the pauses' draws
}

// Set is what a strategy owns: its clients' hubs and the subscriptions it
// made, which Close ends. The zero value is not usable; use NewSet.
type Set struct {
	clients []redis.UniversalClient
	keys    []any
	subs    map[*Sub]struct{}
	closed  bool
}

// NewSet returns a Set over clients. It starts nothing: a hub starts at
// the first Watch on its client.
func NewSet(clients ...redis.UniversalClient) *Set {
	s := &Set{clients: clients, keys: make([]any, len(clients)), subs: map[*Sub]struct{}{}}
	for i, c := range clients {
		s.keys[i] = registryKey(c)
	}
	return s
}

// registryKey is the client itself where it can be a map key, so that
// every Set of the process on one client shares its hub; otherwise a key
// of this Set alone.
func registryKey(c redis.UniversalClient) any {
	if t := reflect.TypeOf(c); t != nil && t.Comparable() {
		return c
	}
	return &struct{ redis.UniversalClient }{c}
}

// Watch subscribes waiter (its id in the key's line in fair mode, "" if
// it waits without fairness) to channel on every client of s and returns
// once need of them confirmed the subscription, or every client confirmed
// or failed, or bound passed, or ctx is done. notices receives a value
// when a message on channel on any client picks this waiter (see pick),
// and after a connection that carried it broke, or came back; it is never
// closed. stop ends the subscription; call it when the wait is over (more
// calls do nothing), with handOn true if the waiter took a notice that no
// attempt of its own answered (it gives up, or its attempt failed on the
// way): the notice then goes to the next waiter, so that a release is
// not left unanswered in this process. The subscription stays in place
// whatever Watch returned on: a client that confirms later delivers from
// then on. The only error is ErrClosed.
func (s *Set) Watch(ctx context.Context, channel, waiter string, need int, bound time.Duration) (notices <-chan struct{}, stop func(handOn bool), err error) {
	mu.Lock()
	if s.closed {
		mu.Unlock()
		return nil, nil, ErrClosed
	}
	sub := s.registerLocked(channel, waiter, backoff.NewStream(ctx, undoTag))
	mu.Unlock()
	stop = sub.stop

	t := time.NewTimer(bound)
	defer t.Stop()
	for range 16 * (len(s.clients) + 1) { // each client confirms or fails once, or a few times if its connection flaps; bound passes before this
		if sub.ready(need) {
			break
		}
		select {
		case <-sub.progress:
		case <-t.C:
			return sub.notify, stop, nil
		case <-ctx.Done():
			return sub.notify, stop, nil
		}
	}
	return sub.notify, stop, nil
}

// Listen registers waiter on channel as Watch does, but only if need of
// the Set's clients already have channel subscribed and confirmed (other
// waiters of the process keep it so), and then without I/O and without
// waiting: a release applied after Listen returned is published on a
// subscription the server already confirmed, and reaches this process.
// Otherwise it registers nothing and ok is false. On a hot key this lets a
// new waiter's first check already be the check after subscribing, which
// saves the second check (an attempt on every node) that Watch needs.
// Nothing waits on ctx; the waiter's jitter is drawn from it, as Watch's.
func (s *Set) Listen(ctx context.Context, channel, waiter string, need int) (notices <-chan struct{}, stop func(handOn bool), ok bool) {
	if Idle() {
		return nil, nil, false
	}
	mu.Lock()
	defer mu.Unlock()
	if s.closed {
		return nil, nil, false
	}
	live := 0
	for _, k := range s.keys {
		if h := hubs[k]; h != nil && !h.stopping {
			if e := h.chans[channel]; e != nil && e.confirmed && len(e.subs) > 0 {
				live++
			}
		}
	}
	if live < need {
		return nil, nil, false
	}
	sub := s.registerLocked(channel, waiter, backoff.NewStream(ctx, undoTag))
	return sub.notify, sub.stop, true
}

// registerLocked makes waiter's Sub on channel on every client of s,
// making the entries (and hubs) that do not exist yet.
func (s *Set) registerLocked(channel, waiter string, jitter *backoff.Stream) *Sub {
	seq++
	sub := &Sub{set: s, id: waiter, seq: seq, notify: make(chan struct{}, 1), progress: make(chan struct{}, 1), jitter: jitter}
	for i, c := range s.clients {
		h := hubFor(s.keys[i], c)
		e := h.chans[channel]
		if e == nil {
			e = &entry{channel: channel, subs: map[*Sub]struct{}{}}
			h.chans[channel] = e
			h.kickLocked()
		}
		e.subs[sub] = struct{}{}
		sub.hubs = append(sub.hubs, h)
		sub.entries = append(sub.entries, e)
	}
	s.subs[sub] = struct{}{}
	return sub
}

// stop ends sub (Watch's stop).
func (sub *Sub) stop(handOn bool) {
	mu.Lock()
	sub.removeLocked(handOn)
	mu.Unlock()
}

// ready reports whether need entries are confirmed, or every entry is
// decided, or the Sub was removed (Close).
func (sub *Sub) ready(need int) bool {
	mu.Lock()
	defer mu.Unlock()
	ok, failed := 0, 0
	for _, e := range sub.entries {
		switch {
		case e.confirmed:
			ok++
		case e.err != nil:
			failed++
		}
	}
	return sub.removed || ok >= need || ok+failed == len(sub.entries)
}

// UndoNotice is the message of an undo's publish: a failed attempt
// deleted its own key on the nodes that had granted it, while a majority
// refused. It is not a release. Waking at once on it made every waiter
// take the same free nodes, be refused and undo in turn, for as long as a
// holder kept a bare majority: a storm of acquisitions (chaos/sim's
// TestFindingUndoPublishStorm). Ignoring it left a split vote (every
// waiter refused, every one undoing) to the waiters' backoff. So it is
// passed on after a jittered pause, undoBase at first and doubling with
// each undo notice since the last release notice, up to undoMax: a split
// vote is retried within milliseconds, staggered, and a storm dies down.
// No waiter id (base64url) or release message is "!".
const UndoNotice = "!"

// ReleaseMark starts the message of a holder's release whose line is
// empty (script.Release): "~" and the released token. No waiter id
// (base64url) starts with it. A message with it names one release, so a
// hub tells the pushes of one release from several nodes apart from the
// next release (entry.heard).
const ReleaseMark = "~"

// heardKept is how many releases an entry remembers: the pushes of one
// release from the nodes of a quorum arrive within a few round trips of
// each other, before a few more releases of the key can have been heard.
const heardKept = 4

// heardRelease is a release a hub heard (by its token) and the waiter it
// woke.
type heardRelease struct {
	token string
	woke  *Sub
}

// Pacing of undo notices (see UndoNotice). A waiter's pauses draw their
// jitter from its Watch or Listen context (backoff.NewStream, undoTag: the
// Lock call's retries draw apart under tag 0).
const (
	undoBase = 5 * time.Millisecond
	undoMax  = time.Second
	undoTag  = 1
)

// undoneLocked schedules the notice of an undo, unless one is on its way.
func (sub *Sub) undoneLocked() {
	if sub.removed || sub.pause != nil {
		return
	}
	sub.undos++
	d := backoff.Jittered(sub.jitter, sub.undos, undoBase, undoMax)
	sub.pause = time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		sub.pause = nil
		if !sub.removed {
			signal(sub.notify)
		}
	})
}

// removeLocked takes sub off every entry; an entry left without waiters
// is unsubscribed by its hub's writer. With handOn, or with a notice
// still unread in sub's channel, the longest waiting of those left on
// each entry is woken in its place.
func (sub *Sub) removeLocked(handOn bool) {
	if sub.removed {
		return
	}
	sub.removed = true
	select {
	case <-sub.notify:
		// A notice that came after the waiter last looked: nobody
		// answered it, whatever the waiter said.
		handOn = true
	default:
	}
	undoOwed := sub.pause != nil // an undo's notice on its way to sub
	if undoOwed {
		sub.pause.Stop()
		sub.pause = nil
	}
	delete(sub.set.subs, sub)
	for i, e := range sub.entries {
		delete(e.subs, sub)
		switch {
		case len(e.subs) == 0:
			sub.hubs[i].kickLocked()
		case handOn:
			signal(e.oldestLocked(false).notify)
		case undoOwed:
			e.oldestLocked(false).undoneLocked()
		}
	}
}

// pick returns the waiter of the entry that a message wakes, or nil:
//
//   - a release that names the line's new head (fair mode) wakes that
//     waiter if it is here, and otherwise the longest waiting of those
//     without fairness (only the head can take the key, and this
//     process's fair waiters would be refused; a waiter without fairness
//     ignores the line);
//   - a release with an empty line (ReleaseMark, or an older version's
//     empty message), and an undo (UndoNotice), wake the longest waiting.
//
// One waiter per message, not all: every waiter woken takes a script call
// on every node, and all but one are refused, so waking all of a hot
// key's waiters would spend the nodes' time on refusals
// (BenchmarkContention measures it).
// Every hub of a Set picks the same waiter (the order is the process's):
// the pushes of one release from five nodes that reach the process while
// that waiter still waits wake it alone (its channel holds one notice). A
// waiter that does not answer its notice hands it on (Watch's stop); one
// granted the key drops a notice left unread (the Locker does, before
// stop). A release that names itself (ReleaseMark) is not picked for
// again: its later pushes go to the waiter its first woke, while that
// waiter waits (its attempt may have met a node that had not applied the
// release yet), and to nobody once it has left (granted, or refused by a
// later holder, whose release wakes the next; handOn passes on a notice
// it did not answer). A release without a name (an older version's, or
// Leave's) is picked for at every push, and its pushes after the woken
// waiter left wake the next one, who is refused.
func (e *entry) pickLocked(payload string) *Sub {
	if payload == "" || payload == UndoNotice || strings.HasPrefix(payload, ReleaseMark) {
		return e.oldestLocked(false)
	}
	for sub := range e.subs {
		if sub.id == payload {
			return sub
		}
	}
	return e.oldestLocked(true)
}

// heardLocked returns the release token names if e heard it among its
// last heardKept.
func (e *entry) heardLocked(token string) (heardRelease, bool) {
	for i := range heardKept {
		r := e.heard[(e.heardNext+heardKept-1-i)%heardKept]
		if r.woke != nil && r.token == token {
			return r, true
		}
	}
	return heardRelease{}, false
}

// recordHeardLocked records on every entry of sub that the release token
// woke it.
func (sub *Sub) recordHeardLocked(token string) {
	for _, e := range sub.entries {
		e.heard[e.heardNext] = heardRelease{token: token, woke: sub}
		e.heardNext = (e.heardNext + 1) % heardKept
	}
}

// oldestLocked returns the entry's longest-waiting waiter (only among
// those without fairness if unfairOnly), or nil.
func (e *entry) oldestLocked(unfairOnly bool) *Sub {
	var first *Sub
	for sub := range e.subs {
		if unfairOnly && sub.id != "" {
			continue
		}
		if first == nil || sub.seq < first.seq {
			first = sub
		}
	}
	return first
}

// signal sends on a buffer-of-one channel without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Close ends every subscription made through s (their waiters are woken
// once and then hear nothing more) and makes later Watch calls fail. It
// waits, at most wait, for the hubs it left without channels to stop. A
// hub on a live connection stops within a few scheduling delays. One whose
// goroutine is inside go-redis's dial to a hung node (paused, say: the
// kernel completes the connection, the handshake's reply never comes)
// cannot be stopped before that dial gives up, since go-redis holds the
// subscription's lock through the dial and closing it needs that lock:
// Close returns at wait then, and the hub stops on its own once the dial
// fails (at the client's DialTimeout and ReadTimeout, whatever its
// ContextTimeoutEnabled).
func (s *Set) Close(wait time.Duration) {
	mu.Lock()
	s.closed = true
	for sub := range s.subs {
		sub.removeLocked(false)
		signal(sub.notify)
		signal(sub.progress) // a Watch still waiting for confirmations returns
	}
	var stopping []chan struct{}
	for _, k := range s.keys {
		h := hubs[k]
		if h == nil {
			continue
		}
		idle := true
		for _, e := range h.chans {
			if len(e.subs) > 0 {
				idle = false
				break
			}
		}
		if idle {
			signal(h.flush)
			stopping = append(stopping, h.done)
		}
	}
	mu.Unlock()
	if len(stopping) == 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, d := range stopping {
		select {
		case <-d:
		case <-t.C:
			return
		}
	}
}

// Idle reports whether the process has no subscription connection (no
// hub) at all, without taking the process's lock: Listen would then
// register nothing, so a caller may skip building its channel's name.
// One that a Watch is starting meanwhile may be missed, as if Idle had
// been asked a moment sooner.
func Idle() bool { return hubCount.Load() == 0 }

// hubFor returns the running hub of key, starting one if there is none or
// the last one is stopping. Call with mu held.
func hubFor(key any, c redis.UniversalClient) *hub {
	if h := hubs[key]; h != nil && !h.stopping {
		return h
	}
	h := &hub{
		key:      key,
		ps:       c.Subscribe(context.Background()), // no channel: no I/O yet
		chans:    map[string]*entry{},
		unsubs:   map[string]int{},
		kick:     make(chan struct{}, 1),
		flush:    make(chan struct{}, 1),
		stop:     make(chan struct{}),
		readDone: make(chan struct{}),
		done:     make(chan struct{}),
	}
	hubs[key] = h
	hubCount.Store(int64(len(hubs)))
	go h.read()
	go h.write()
	return h
}

func (h *hub) kickLocked() { signal(h.kick) }

// write is the writer goroutine: it sends SUBSCRIBE for new channels and
// UNSUBSCRIBE for channels without waiters, and stops the hub once it has
// had no channel for linger (at once after a flush).
func (h *hub) write() {
	defer close(h.done)
	var lingerC <-chan time.Time // not nil while idle: when to stop
	for {
		// A flush (Close) goes before a kick that came with it (Close's
		// waiters leaving): the hub stops without an UNSUBSCRIBE first,
		// and the choice is not a select's random one (the simulator
		// replays a seed).
		expire := false
		select {
		case <-h.flush:
			expire = true
		default:
			select {
			case <-h.kick:
			case <-h.flush:
				expire = true
			case <-lingerC:
				expire = true
			}
		}
		var subs, unsubs []string
		mu.Lock()
		for ch, e := range h.chans {
			if len(e.subs) == 0 {
				delete(h.chans, ch)
				if e.sent {
					unsubs = append(unsubs, ch)
					h.unsubs[ch]++
				}
				continue
			}
			if !e.sent {
				e.sent = true
				subs = append(subs, ch)
			}
		}
		// In name order, not the map's: the batch's command line, and
		// the order of its confirmations, are then the same in every run
		// of the same events (the simulator replays a seed).
		slices.Sort(subs)
		slices.Sort(unsubs)
		if len(subs) > 0 {
			h.pending = append(h.pending, subs)
		}
		idle := len(h.chans) == 0
		if idle && expire {
			h.stopping = true
			if hubs[h.key] == h {
				delete(hubs, h.key)
				hubCount.Store(int64(len(hubs)))
			}
			close(h.stop)
		}
		mu.Unlock()
		if idle && expire {
			_ = h.ps.Close() // unblocks the reader's read
			<-h.readDone
			return
		}
		switch {
		case !idle:
			lingerC = nil
		case lingerC == nil:
			lingerC = time.After(linger) // one timer per idle spell; it ends with linger
		}
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		if len(unsubs) > 0 {
			// On error the connection is being replaced (or there was
			// none and the dial failed), and go-redis has already
			// dropped these channels from what it resubscribes. No
			// reply to this UNSUBSCRIBE will come on the connection the
			// reader uses next: stop counting it, or a later waiter's
			// confirmation for the channel would be taken for an older
			// one and dropped.
			if err := h.ps.Unsubscribe(ctx, unsubs...); err != nil {
				mu.Lock()
				for _, ch := range unsubs {
					h.unsubDoneLocked(ch)
				}
				mu.Unlock()
			}
		}
		if len(subs) > 0 {
			if err := h.ps.Subscribe(ctx, subs...); err != nil {
				// Not sent (no connection): go-redis subscribes them
				// when the reader's next read reconnects.
				mu.Lock()
				h.brokenLocked(err)
				mu.Unlock()
			}
		}
		cancel()
	}
}

// read is the reader goroutine: messages wake waiters, confirmations and
// refusals decide subscriptions, a broken connection wakes everyone.
func (h *hub) read() {
	defer close(h.readDone)
	pause := retryMin
	for {
		msg, err := h.ps.ReceiveTimeout(context.Background(), readTimeout)
		select {
		case <-h.stop:
			return
		default:
		}
		var ne net.Error
		var re redis.Error
		switch {
		case err == nil:
			pause = retryMin
			mu.Lock()
			h.handleLocked(msg)
			mu.Unlock()
			continue
		case errors.As(err, &re):
			// The server refused a SUBSCRIBE (NOPERM: the user may not
			// use one of its channels): charged to every channel of the
			// oldest one in flight.
			mu.Lock()
			if len(h.pending) > 0 {
				for _, ch := range h.pending[0] {
					if e := h.chans[ch]; e != nil && !e.confirmed {
						e.err = err
						e.progressLocked()
					}
				}
				h.pending = h.pending[1:]
			}
			mu.Unlock()
			continue
		case errors.As(err, &ne) && ne.Timeout():
			continue // nothing came
		}
		mu.Lock()
		h.brokenLocked(err)
		mu.Unlock()
		t := time.NewTimer(pause)
		select {
		case <-h.stop:
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, retryMax)
	}
}

// handleLocked applies one message of the subscription connection.
func (h *hub) handleLocked(msg any) {
	switch m := msg.(type) {
	case *redis.Message:
		e := h.chans[m.Channel]
		if e == nil {
			return
		}
		token, named := strings.CutPrefix(m.Payload, ReleaseMark)
		if named {
			if heard, ok := e.heardLocked(token); ok {
				// Another node's push of a release already heard.
				if !heard.woke.removed {
					signal(heard.woke.notify)
				}
				return
			}
		}
		woken := e.pickLocked(m.Payload)
		if m.Payload == UndoNotice {
			if woken != nil {
				woken.undoneLocked()
			}
			return
		}
		// A release: undos paced before it are answered by it.
		for sub := range e.subs {
			sub.undos = 0
			if sub.pause != nil {
				sub.pause.Stop()
				sub.pause = nil
			}
		}
		if woken != nil {
			if named {
				woken.recordHeardLocked(token)
			}
			signal(woken.notify)
		}
	case *redis.Subscription:
		switch m.Kind {
		case "subscribe":
			if len(h.pending) > 0 && h.pending[0][0] == m.Channel {
				if h.pending[0] = h.pending[0][1:]; len(h.pending[0]) == 0 {
					h.pending = h.pending[1:]
				}
			}
			if h.unsubs[m.Channel] > 0 {
				return // an UNSUBSCRIBE sent after it is still on its way
			}
			e := h.chans[m.Channel]
			if e == nil {
				return
			}
			e.confirmed, e.err = true, nil
			if e.interrupted {
				// Releases published while the connection was down are
				// lost: let the waiters look again.
				e.interrupted = false
				for sub := range e.subs {
					signal(sub.notify)
				}
			}
			e.progressLocked()
		case "unsubscribe":
			h.unsubDoneLocked(m.Channel)
		}
	}
}

// unsubDoneLocked takes one UNSUBSCRIBE of channel off the count of those on
// their way: its reply came, or it was never sent. The count never goes
// below zero (a broken connection cleared it meanwhile).
func (h *hub) unsubDoneLocked(channel string) {
	if n := h.unsubs[channel]; n > 1 {
		h.unsubs[channel] = n - 1
	} else {
		delete(h.unsubs, channel)
	}
}

// brokenLocked records a connection that broke or could not be made:
// every channel is unconfirmed until go-redis's reconnect resubscribes it,
// and the waiters of channels that were confirmed are woken once, since a
// release may have been published while nobody listened.
func (h *hub) brokenLocked(err error) {
	h.pending = h.pending[:0]
	clear(h.unsubs)
	for _, e := range h.chans {
		if e.confirmed {
			e.interrupted = true
			for sub := range e.subs {
				signal(sub.notify)
			}
		}
		e.confirmed, e.err = false, err
		e.progressLocked()
	}
}

// progressLocked tells the entry's waiters that it was confirmed or
// failed.
func (e *entry) progressLocked() {
	for sub := range e.subs {
		signal(sub.progress)
	}
}

// Hubs reports how many hubs are running in the process, for tests: one
// per client with waiters.
func Hubs() int {
	mu.Lock()
	defer mu.Unlock()
	return len(hubs)
}
