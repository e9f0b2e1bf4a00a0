package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/stretchr/testify/require"
)

// 15. The idempotency barrier under client retries and a Sentinel failover
// between claim and complete. Records live on a Sentinel-managed primary
// (the failover strategy keeps requests in flight exclusive); every request
// is sent three times, concurrently and after "timeouts"; the primary is
// failed over mid-run. The ledger (SQLite, UNIQUE settlement id) must hold
// exactly one effect per request, every acknowledged entry must be there,
// and callers get the stored result or an in-progress answer.
func TestScenario15IdempotencyUnderRetriesAndFailover(t *testing.T) {
	run(t, scenario{name: "15 idempotency: retries + failover between claim and complete", strategy: "barrier on failover", faults: "duplicates ×3, SENTINEL FAILOVER mid-run"},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			g := StartSentinelGroup(t, "s15", time.Second)
			client := g.Client(t)
			strategy2, err := failover.New(client, failover.WithMaster(g.Master))
			require.NoError(t, err)
			b, err := idempotency.New(client, idempotency.WithStrategy(strategy2),
				idempotency.WithLease(2*time.Second), idempotency.WithRetention(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "ledger.db")+"?_pragma=busy_timeout(5000)")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			if _, err := db.Exec(`CREATE TABLE ledger (id TEXT PRIMARY KEY, fence INTEGER NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			// Requests are independent keys: no two holds compete, so O2 and the
			// register say nothing here; the ledger (O4) and its unique id are the
			// oracles.
			const requests = 60
			var applied, replays, inProgress, duplicateInserts atomic.Int32
			acked := make([]atomic.Bool, requests)
			var wg sync.WaitGroup
			send := func(i int) {
				id := fmt.Sprintf("stl-%d", i)
				out, err := b.DoWait(ctx, idempotency.Request{Key: id, Fingerprint: idempotency.Fingerprint(id, "100")}, 3*time.Second,
					func(ctx context.Context, fence uint64) ([]byte, error) {
						time.Sleep(20 * time.Millisecond) // the work, during which the failover may land
						_, werr := db.ExecContext(ctx, `INSERT INTO ledger (id, fence) VALUES (?, ?)`, id, fence)
						if werr != nil {
							duplicateInserts.Add(1) // the ledger's unique constraint refused a second effect
							return nil, idempotency.Final(werr)
						}
						applied.Add(1)
						return []byte("ok"), nil
					})
				switch {
				case err == nil:
					acked[i].Store(true)
					if out.Replayed {
						replays.Add(1)
					}
				case errors.Is(err, idempotency.ErrInProgress):
					inProgress.Add(1)
				default:
					rec.Failure(id, err)
				}
			}
			for i := range requests {
				for range 3 {
					wg.Go(func() { send(i) })
				}
				if i == requests/2 {
					old, _ := g.PrimaryAddr(ctx, t)
					end := fault(rec, "SENTINEL FAILOVER")
					_ = g.SentinelClients(t)[0].Failover(ctx, g.Master).Err()
					// The old primary rejoins as a replica; do now what
					// Sentinel does at its next look, so WAIT can be met.
					if newAddr, err := g.WaitForNewPrimary(ctx, t, old, 10*time.Second); err == nil {
						_ = reattach(ctx, g, newAddr)
					}
					end()
				}
				time.Sleep(10 * time.Millisecond)
			}
			wg.Wait()

			var rows int
			_ = db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&rows)
			lost := 0
			for i := range requests {
				var n int
				_ = db.QueryRow(`SELECT count(*) FROM ledger WHERE id = ?`, fmt.Sprintf("stl-%d", i)).Scan(&n)
				if acked[i].Load() && n != 1 {
					lost++
				}
			}
			var violations []string
			if rows > requests {
				violations = append(violations, fmt.Sprintf("%d ledger rows for %d requests", rows, requests))
			}
			return facts{ledgerLost: lost, violations: violations, notes: []string{fmt.Sprintf(
				"%d requests ×3: %d applied, %d replayed, %d in progress at the deadline, %d second effects refused by the ledger's unique id",
				requests, applied.Load(), replays.Load(), inProgress.Load(), duplicateInserts.Load())}}
		})
}

// reattach points the old primary at the new one, as Sentinel would.
func reattach(ctx context.Context, g *SentinelGroup, newAddr string) error {
	host, port, err := net.SplitHostPort(newAddr)
	if err != nil {
		return err
	}
	for _, s := range []*redistest.Server{g.Primary, g.Replica} {
		if s.Addr == newAddr || !s.Alive() {
			continue
		}
		if err := s.Client().ReplicaOf(ctx, host, port).Err(); err != nil {
			return err
		}
	}
	return nil
}
