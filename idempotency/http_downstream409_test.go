package idempotency_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// wireRelay is a payment API's handler: it forwards the request, with its
// Idempotency-Key, to a payment provider at url and relays the provider's
// status, Content-Type, Retry-After and body; 504 if the provider does not
// answer. Its first run gives up on the provider when giveUp is closed (its
// own outgoing timeout, forced). It counts its runs.
type wireRelay struct {
	url    string
	client *http.Client
	giveUp chan struct{}
	runs   atomic.Int32
}

func (a *wireRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if n == 1 {
		go func() {
			select {
			case <-a.giveUp:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	body, _ := io.ReadAll(r.Body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set(idempotency.HeaderIdempotencyKey, r.Header.Get(idempotency.HeaderIdempotencyKey))
	resp, err := a.client.Do(req)
	if err != nil {
		http.Error(w, "payment provider did not answer", http.StatusGatewayTimeout)
		return
	}
	defer resp.Body.Close()
	for _, f := range []string{"Content-Type", "Retry-After"} {
		if v := resp.Header.Get(f); v != "" {
			w.Header().Set(f, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// A payment API behind the Middleware relays its payment provider's answer;
// the provider honours Idempotency-Key too (here: a Middleware of its own
// on the same Redis). The API's first run gives up on the provider while
// the provider is charging (504, not recorded); the client's retry reaches
// the provider while that charge is still in progress and relays its 409 +
// Retry-After. That 409 is not an outcome: once the charge is done, the
// client's next retry must run the API's handler again and get the charge,
// not a 409 replayed for the retention while the charge is never reported.
func TestHTTPDownstreamInProgressIsNotRecorded(t *testing.T) {
	wireNoLeaks(t)
	srv := redistest.Start(t, redistest.Config{})
	bAPI, err := idempotency.New(srv.Client())
	require.NoError(t, err)
	bProv, err := idempotency.New(srv.Client(), idempotency.WithPrefix("prov:"))
	require.NoError(t, err)

	// The provider: its first charge waits for the latch.
	var charges atomic.Int32
	started := make(chan struct{}, 1)
	latch := newWireLatch()
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		select {
		case started <- struct{}{}:
		default:
		}
		if !latch.wait(r.Context(), 10*time.Second) {
			http.Error(w, "charge interrupted", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charge":"ch_` + strconv.Itoa(int(n)) + `"}`))
	})
	provMW, err := idempotency.Middleware(bProv, idempotency.WithGlobalKeys())
	require.NoError(t, err)
	prov := wireServe(t, provMW(charge))
	// The same provider seen by the test, waiting for a charge in progress
	// to complete (the same records: same Barrier prefix, route and key).
	probeMW, err := idempotency.Middleware(bProv, idempotency.WithGlobalKeys(), idempotency.WithInFlightWait(10*time.Second))
	require.NoError(t, err)
	probe := wireServe(t, probeMW(charge))

	relay := &wireRelay{url: prov.URL + "/charges", client: wireClient(t, 20*time.Second), giveUp: make(chan struct{})}
	apiMW, err := idempotency.Middleware(bAPI, idempotency.WithGlobalKeys())
	require.NoError(t, err)
	api := wireServe(t, apiMW(relay))
	t.Cleanup(latch.open)
	client := wireClient(t, 20*time.Second)

	firstDone := make(chan wireReply, 1)
	go func() { firstDone <- wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100") }()
	wireReceive(t, started, 10*time.Second, "the provider's charge started")
	close(relay.giveUp)
	first := wireReceive(t, firstDone, 10*time.Second, "the API's first answer")
	require.NoError(t, first.err)
	assert.Equal(t, http.StatusGatewayTimeout, first.resp.StatusCode, "body: %s", first.body)

	second := wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100")
	require.NoError(t, second.err)
	require.Equal(t, http.StatusConflict, second.resp.StatusCode, "the provider's charge is in progress: body %s", second.body)
	assert.NotEmpty(t, second.resp.Header.Get("Retry-After"))
	assert.Contains(t, string(second.body), `"in-progress"`)

	latch.open()
	done := wirePost(t.Context(), client, probe.URL+"/charges", httpKey, "100")
	require.NoError(t, done.err)
	require.Equal(t, http.StatusCreated, done.resp.StatusCode, "the provider's charge completed: body %s", done.body)
	assert.Equal(t, "true", done.resp.Header.Get(idempotency.HeaderIdempotentReplayed))

	third := wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100")
	require.NoError(t, third.err)
	assert.Equal(t, http.StatusCreated, third.resp.StatusCode, "the retry learns of the charge: body %s", third.body)
	assert.Equal(t, `{"charge":"ch_1"}`, string(third.body))
	assert.Empty(t, third.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "the API's handler ran again")

	fourth := wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100")
	require.NoError(t, fourth.err)
	assert.Equal(t, http.StatusCreated, fourth.resp.StatusCode)
	assert.Equal(t, `{"charge":"ch_1"}`, string(fourth.body))
	assert.Equal(t, "true", fourth.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "then the charge is replayed")

	assert.EqualValues(t, 1, charges.Load(), "one charge at the provider")
	assert.EqualValues(t, 3, relay.runs.Load())
}

// Every 409 a handler answers is sent but not recorded, with or without
// Retry-After, whatever WithTransientStatuses lists and whatever the
// Barrier's WithStoreEverything says: the retry runs the handler.
func TestHTTPConflictIsNeverRecorded(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		barrier    []idempotency.Option
		opts       []idempotency.HTTPOption
	}{
		{"with Retry-After", "3", nil, nil},
		{"without Retry-After", "", nil, nil},
		{"no transient statuses", "3", nil, []idempotency.HTTPOption{idempotency.WithTransientStatuses()}},
		{"transient 429 only, server errors stored", "", nil, []idempotency.HTTPOption{
			idempotency.WithTransientStatuses(http.StatusTooManyRequests), idempotency.WithStoreServerErrors(true)}},
		{"Barrier stores everything", "", []idempotency.Option{idempotency.WithStoreEverything()}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t, tc.barrier...)
			a := &wireAnswers{statuses: []int{http.StatusConflict, http.StatusCreated}, retryAfter: tc.retryAfter}
			mw, err := idempotency.Middleware(b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			require.NoError(t, err)
			ts := wireServe(t, mw(a))

			got := wireExchanges(t, ts.URL+"/pay", 3)
			assert.Equal(t, http.StatusConflict, got[0].resp.StatusCode)
			assert.Equal(t, tc.retryAfter, got[0].resp.Header.Get("Retry-After"))
			assert.Equal(t, "run 1: 409", string(got[0].body))
			assert.Equal(t, http.StatusCreated, got[1].resp.StatusCode, "the retry runs: body %s", got[1].body)
			assert.Empty(t, got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.Equal(t, "run 2: 201", string(got[2].body), "then the 201 is replayed")
			assert.Equal(t, "true", got[2].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.EqualValues(t, 2, a.runs.Load())
		})
	}
}
