// Package sim is a seeded, virtual-time simulation of redlease against
// in-process Redis nodes. Each seed runs one scenario (a strategy, its
// options and a workload) inside a testing/synctest bubble: every
// goroutine — the workload's clients, go-redis, the library's fan-out
// workers, the nodes — runs on the bubble's virtual clock, so a run of a
// few virtual seconds takes milliseconds of CPU and no real sleeping. The
// library under test is the production code: unmodified go-redis clients
// reach the nodes through a custom Dialer that returns simulated
// connections.
//
// # What is simulated
//
//   - Nodes: each a miniredis command engine (server-level Dispatch, so
//     EVAL/EVALSHA run the library's Lua scripts as they are), its key
//     expiry driven by the node's own clock: the virtual clock plus an
//     offset (miniredis ClockTTL and SetTime before every command).
//   - A Redis Cluster (watchdog-mixed): three nodes acting as its
//     masters, the 16,384 slots split as redis-cli --cluster create
//     splits them (cluster.go). A go-redis ClusterClient, unmodified but
//     for its Dialer, learns the topology from CLUSTER SLOTS (answered
//     by the simulator, which also answers CLUSTER SHARDS, NODES, MYID,
//     KEYSLOT and INFO: miniredis's own CLUSTER claims every slot for
//     one node) and COMMAND (miniredis's). A master refuses, as Redis
//     does, a command on a key of another master's slot (MOVED, nothing
//     applied), keys of several slots in one command (CROSSSLOT), and a
//     script touching a key of another master or of another slot than
//     its declared keys (Redis 7's errors). The refusals are counted;
//     since nothing moves, any is a key routed to the wrong master.
//   - Links: every go-redis connection is a simulated one. Its writes are
//     parsed into commands; each request and each reply gets a delay drawn
//     from a hash of the seed, the direction and the message's identity:
//     a request's is its client, node, content and how many times that
//     client sent that content to that node before; a reply's the request
//     the node last took from the connection and its count since. Its
//     fate does not depend on which goroutine happened to send first, nor
//     on which of a client's pooled connections it took.
//     Both directions keep FIFO order per connection, as TCP does; there
//     is no order across connections. Delays are 20–500 µs, with 2 %
//     spikes of up to 40 ms (a reply arriving after the next attempt
//     started).
//   - Faults, drawn per seed before the run (the schedule; same seed, same
//     schedule): a node's links slowed (delay) or lossy (loss: a request
//     lost before it is applied, or a reply lost after), a client cut off
//     from some nodes (partition), connections cut (cut), a node paused
//     (it queues everything, then serves the queue in order), a node
//     crashed and restarted empty, from an earlier snapshot or with its
//     data (restart), a node's clock jumping forward (clock-jump), a
//     majority's clocks jumping (clock-skew), every message to and from a
//     node lost while its connections stay open (blackhole; Watchdog
//     scenario), the idempotency store crashing and coming back with its
//     data (blink; Barrier scenario), and 0.2 % of messages lost at
//     random. Faults start in the first three quarters of the scenario's
//     Horizon, set near its workload's mean virtual length (with one
//     horizon of 1.5 s for all, half the faults fell after the workload
//     had ended); Kinds restricts the kinds a scenario draws.
//   - Scenarios (Scenarios, rotated by seed): quorum5-fenced,
//     quorum5-restart (fences and the delayed-restart rule),
//     quorum3-plain (no fences), quorum3-restart (the rule),
//     quorum3-extend (the rule with long holds, every extension past
//     its max TTL, restarts and loss: built for the bound of 8a56ae8),
//     watchdog-mixed, barrier, single, quorum3-pastmax (aimed at the
//     same bound, with its own schedule and client: pastmax.go),
//     failover, wake-single and wake-quorum3 (waiters woken by release
//     notices: wakework.go), fair-quorum5 (quorum5-restart with fair
//     mode: three clients in the keys' lines, one outside them, under
//     the general faults), fair-single and fair-quorum3 (the wake ones
//     with fair mode: two clients in the key's line, one outside it).
//     The rotation had ten scenarios before the two wake ones and twelve
//     before the three fair ones: seed s of the rotation ran
//     Scenarios[s % 10], then Scenarios[s % 12], and now runs
//     Scenarios[s % 15] (a seed given with -scenario runs as before).
//   - Pub/sub (Wake scenarios, pubsub.go): every Locker elsewhere waits
//     by polling (WithPolling); in wake-single and wake-quorum3 they
//     wait by notices, as by default. The nodes answer SUBSCRIBE,
//     UNSUBSCRIBE, PING in subscribed mode and PUBLISH (also the release
//     script's) themselves: a message is a reply sent over the
//     subscriber's own link, in FIFO order with its replies and with its
//     delays. Faults, drawn by wakeSchedule (none to three per seed, a
//     quarter of the seeds with none): lostpub (each push from a node
//     lost with probability 0.5–1 for 20–400 ms, the connection up and
//     the subscription confirmed), subcut (a node's subscription
//     connections cut: go-redis reconnects and resubscribes, and the
//     hub wakes its waiters at the break and at the reconfirmation) and
//     subslow (pushes delayed by up to 5–150 ms more for 20–400 ms).
//     Nothing else: no node faults, no random loss of commands (pushes
//     only, under those faults), spikes as everywhere.
//   - Failover (replica.go, sentinel.go, failoverwork.go): a primary and
//     one replica, each a miniredis engine. The primary ships each
//     write's effects (the state of the keys a script declared that
//     changed, with an absolute expiry, as Redis 7 replicates a script's
//     effects and PXAT) over a replication link with its own seeded
//     delay; the replica applies them in order and acknowledges its
//     offset back. WAIT n timeout answers from the acknowledged offset,
//     blocking the connection up to its timeout on the virtual clock.
//     Fence counters replicate like any key. Link faults: repl-slow,
//     repl-hole (everything held both ways until it ends: WAIT returns 0
//     meanwhile, as NOTES.md measured), repl-cut (in flight lost,
//     resynchronised from the primary's data when it reconnects). Three
//     Sentinels, each a node whose commands the simulator answers
//     (SENTINEL get-master-addr-by-name, master with its config-epoch,
//     sentinels, replicas; SUBSCRIBE/UNSUBSCRIBE and PING in subscribed
//     mode), reached by go-redis SentinelClients through the Dialer.
//     One failover per run: the primary killed (crash, promotion after a
//     30-80 ms down-after, back empty 50-300 ms later as a replica of the
//     new primary) or not (switch: promoted at once; the old primary
//     serves, with WAIT answering 0, until it is demoted 0-100 ms later
//     and its client connections close); one in eight promotes a stale
//     replica (its data 20-200 ms old: acknowledged writes lost). The
//     leader Sentinel adopts the new configuration (epoch 2) at the
//     promotion, the others 0-150 ms later, each publishing
//     +switch-master to its subscribers over their own links. Sentinel
//     faults: sentinel-hung (accepts, never answers, to the end of the
//     run: the issue-12 case, half the seeds), sentinel-down,
//     sentinel-lossy; never all three Sentinels.
//   - Workload lockClient (the quorum and single scenarios): several
//     clients per run, each with its own go-redis clients and strategy,
//     doing Lock (with retries) or TryLock on a few contended keys,
//     holding for a while, writing their fence to a fenced register while
//     Valid, extending, and releasing — with a ctx too short for the
//     reply a quarter of the time, and not at all one time in ten.
//   - Workload pastMaxClient (quorum3-pastmax, pastmax.go): three
//     clients on one key until the 300 ms horizon, each trying again
//     every 2–20 ms, the holder extending every 3–30 ms, three times in
//     four to 1.1–2.5 times the 100 ms max TTL; its schedule partitions
//     each client (p 2/3) from one node for most of the run, so grants and
//     extensions land on bare majorities and the holder hears no refusal
//     from the node it cannot reach, and restarts one or two nodes empty
//     (down 0–15 ms) inside the holds, sometimes with a lossy node.
//   - Workload doClient (watchdog-mixed): each client has one
//     renew.Watchdog keeping three Lockers, quorum over nodes 0–4
//     (fenced), single on node 5, and single on a ClusterClient to the
//     Cluster (nodes 6–8; one lock key per master), and runs one lane
//     per Locker at once, each doing Locker.Do three times on keys of its
//     strategy, so that the one watchdog keeps locks of all three
//     strategies together; fn works one to three TTLs in steps (so the
//     watchdog must renew), stops when its ctx ends, checks the nodes
//     and writes to the fenced register while the lock is Valid. The
//     Cluster's faults are drawn apart: one to three per seed, all on one
//     master (pause, blackhole, errnode, badkey of the key it serves).
//   - Workload barrierClient (barrier): each client has its own
//     idempotency.Barrier on the store (node 0; the default single lock,
//     kept by the client's own Watchdog, a lease of 30–150 ms) and sends
//     requests on three shared keys with a 20–150 ms timeout and up to
//     four tries; the handler works 5–100 ms and, if its ctx is still
//     live, applies its effect to a fenced effect store (it refuses a
//     fence below the key's highest) and returns.
//   - Workload failoverClient (failover): four clients, each a go-redis
//     client to the primary, failover.New on it, and failover.Watch over
//     the three Sentinels (poll 100, 150 or 250 ms); even clients run
//     lockClient, odd ones doClient with their own renew.Watchdog, on the
//     same two keys.
//
// # Invariants (checked on every run)
//
//   - overlap: the belief intervals of one key never intersect. A belief
//     interval runs from the moment Lock/TryLock returned the grant until
//     Lost closed, capped at Until. The library closes Lost when a
//     Release is sent, when a loss is detected and a loss margin before
//     Until, so this is grant → min(release sent, Until, Lost).
//   - release-kept-valid: once a Release was sent, Lost is closed.
//   - fence-order: for fenced strategies, a holder whose interval starts
//     after another's ended has a strictly greater fence.
//   - stale-accepted: the fenced register (in the simulator, never
//     faulted; it accepts a write only above the last accepted fence)
//     never accepts a write that overwrites one made under a later grant.
//   - held-past-expiry (watchdog-mixed): whenever a lock kept by the
//     watchdog says it is Valid, a quorum of its strategy's nodes hold its
//     token (a Cluster lock: the master serving its key), read straight from the nodes (a node that is down counts as
//     holding it; a node whose token a badkey fault replaced counts as
//     holding it until the token would have expired there). A lock is
//     never believed held past its real expiry. At the end of every hold
//     whose token badkey replaced on so many nodes that a quorum no
//     longer holds it, its belief interval must end by the moment a
//     quorum stopped holding it (watchcheck.go).
//   - renew-busy-retry (watchdog-mixed): renewals (extend, extendmany) of
//     one lock sent to the single strategy's node while errnode makes it
//     answer errors (and to a Cluster master, which gets one pipeline per
//     renewal call) are at least min(interval/4, 250 ms) apart, timed at
//     the client's send. On a quorum node they are counted, not failed:
//     a node's fan-out queue holds requests while its workers wait for
//     delayed replies and sends them bunched (up to four within 2 ms),
//     though the rounds keep their pace (at most 10 per lock and node per
//     virtual second over 5,000 seeds).
//   - healthy-lost (watchdog-mixed): a protected hold is never lost. A
//     hold is healthy when no badkey touched its key and every fault of
//     the schedule touched at most a minority of its strategy's nodes
//     while fn ran (single, Cluster: none of its node or master); a
//     bystander is a healthy hold that ran while badkey or errnode hit
//     another key or node. Healthy does not promise survival: random
//     loss and spikes hit every lock. Protected (health.go) does: a
//     quorum of the nodes that held its token at the grant were not
//     faulted and lost no message to or from its client (nor had its
//     connections to them cut: the pooled dead connection costs go-redis's
//     retry backoff at its next use) from 12 s before the grant (the longest a go-redis call without
//     ContextTimeoutEnabled waits on a lost message, retries included)
//     until fn returned, and every renewal window (send to Deadline) was
//     long enough for three round trips (HELLO of a new connection,
//     EVALSHA, EVAL after NOSCRIPT) at the longest one-way delay drawn
//     on those links, in nine tenths of the window (a Cluster master's
//     share). Every other healthy loss is classified in the report:
//     granted on too few nodes for the faults on a minority, a message
//     lost while fn ran or before the grant, validity at grant too short
//     (with or without a spike), TTL too short.
//   - effect-twice (barrier): the fenced effect store accepts a key's
//     effect at most once (all within the records' 30 s retention), unless
//     an earlier run of that key was told its outcome is unknown
//     (ErrRunCancelled, ErrNotRecorded: the Barrier's documented limit;
//     such repeats are counted in the report).
//   - handler-overlap (barrier): two handlers of one idempotency key
//     never run at once with live contexts: a handler's span runs from its
//     start until its ctx ended or it returned. The Barrier's lock makes
//     that impossible inside the assumptions (the handler's ctx ends when
//     the lock's Lost closes, before its validity ends). It found two
//     defects: a loss held back behind a record renewal stuck on the store
//     (37d81c8, found by replaying that mutation: seed 1039), and a
//     handler started after the reply to its claim came back past the
//     lock's validity (seed 15380).
//   - failover-kept (failover): after the failover, let S be the first
//     moment a healthy Sentinel (never hung, neither down nor lossy
//     within the bound of its switch) names the new primary. Every hold
//     whose grant came from the old primary stops claiming validity by
//     max(S, its grant) + 2 poll + min(poll, 1 s) + 100 ms on its client:
//     the next poll starts within a poll; a poll waits for its slowest
//     Sentinel (a hung one) until its ask timeout, min(poll, 1 s); a
//     healthy Sentinel still busy with the previous poll's question (a
//     40 ms spike) is left out of one poll; 100 ms of spikes. Never
//     excused. (The subscription usually revokes within a millisecond.)
//   - handoff-late (wake-*): after a release that returned nil, sent
//     while another client was inside Lock for the key and still is at
//     the bound, some client is granted the key by the holder's grant +
//     its TTL + 208.5 ms (wakeSlack: the refusal's reply, 1 ms, one
//     acquisition with fences' two rounds at the longest one-way delay,
//     scheduler instants). Why: a waiter's wait ends at a notice or at
//     the holder's remaining TTL + 1 ms, which its refusal carries
//     (Locker.retry; the workload's backoff, 1 s, is longer than every
//     TTL), and the key is free by then. That is must-show 5's "within
//     the holder's TTL plus one backoff", with the backoff cut to the
//     TTL as the library does.
//   - wake-slow (wake-*): the same release, with no pub/sub fault from
//     the first waiter's Lock call to the bound: some client is granted
//     the key within 248 ms of the release (the release's request and
//     its push, then one acquisition: six one-way delays, 5 ms), unless
//     that is later than handoff-late's bound. It says the notice, not
//     the TTL, ended the wait.
//   - panic: the library never panics.
//   - goroutine-leak: no goroutine outlives a run (synctest.Test fails the
//     bubble otherwise); stuck: a run ends within 120 virtual seconds.
//
// # Grading
//
// As in the chaos package: a fault outside the strategy's assumptions is
// labelled OUTSIDE in the schedule (a restart that loses data without the
// delayed-restart rule, any node clock jump beyond the drift factor, a
// majority's clock skew; failover: a stale promotion, which loses
// acknowledged writes, and the primary restarted without its data; a
// promotion of the replica that applied every acknowledged write is
// inside, whatever the link faults did to unacknowledged ones); a restart under the delayed-restart rule with
// fences on is labelled OUTSIDE-FENCES (the rule keeps exclusion, not fence
// order). A violation after such a fault is a HAZARD, counted per fault
// kind; any other violation is a FAIL. release-kept-valid, panic, leak
// and stuck are never excused.
//
// # Gaps versus real Redis
//
//   - miniredis, not redis-server: commands are miniredis's
//     implementation. INFO has no "server" section in miniredis; the
//     simulator answers INFO server with redis_version, redis_mode and a
//     run_id (new on every restart), which the delayed-restart rule reads.
//   - WAIT is answered by the simulator (miniredis's WAIT always says 0)
//     from the offset the replica acknowledged when WAIT arrived (all
//     writes so far, as Redis's client offset after its last command).
//     Replication ships key states after each write, not commands: the
//     same as Redis 7's effects for the library's scripts, which touch
//     only their KEYS; other write commands are covered by a short list
//     (SET, DEL, INCR, PEXPIRE...), strings and hashes only. A crashed
//     primary's replication data already sent is still delivered (the
//     kernel flushes a killed process's socket). One replica; one
//     failover per run, never back; the new primary grants nothing until
//     the old one rejoins as its replica (WAIT 1). Sentinel elections,
//     quorum and down-after are not simulated: the schedule decides the
//     promotion and each Sentinel's switch time. A replica answers EVAL
//     and EVALSHA with READONLY whatever the script does.
//   - Failover clients dial the primary as a Sentinel names it, read from
//     that Sentinel's state without a round trip (primaryDialer), not
//     through redis.NewFailoverClient: the failover client holds a
//     sync.Once and its mutex across its network calls to the Sentinels,
//     and a goroutine waiting on a mutex is not durably blocked, so the
//     bubble's clock stopped (the first seed hung). What it does on
//     +switch-master, closing its connections to the old primary, the
//     simulator does when the old primary is demoted. For the same reason
//     a Watcher's Sentinel connections are cut, and its later dials get
//     dead connections, just before its Close (PubSub.Close waits on the
//     mutex a reconnecting Subscribe holds while it reads HELLO's reply).
//   - Sentinel links lose no message at random (only under
//     sentinel-lossy); they get the 40 ms spikes.
//   - EVAL, EVALSHA and SCRIPT LOAD/EXISTS/FLUSH are run by the simulator
//     (lua.go) on one gopher-lua state per node process, as Redis keeps one
//     Lua VM, instead of miniredis's fresh state per call (60 % of the CPU);
//     the scripts are the library's own and redis.call dispatches into
//     miniredis. Only the base, table, string and math libraries are
//     loaded; globals written by a script would persist (Redis forbids
//     them; the library's scripts write none); script errors are reported
//     as "ERR user_script: …" rather than Redis's exact text.
//   - Expiry is exact and lazy (a key is gone the instant its TTL passes);
//     Redis's active expiry cycle and replica-side expiry are not modelled.
//   - Snapshots and durable restarts keep string and hash keys (locks,
//     fence counters, boot markers, idempotency records); other types are
//     lost on any restart.
//   - A lost message models a black-holed link: the connection stays open
//     and the client waits for its read deadline. Real TCP retransmits; it
//     loses data only with the connection.
//   - A connection the client closes still delivers the requests it had
//     in flight (TCP sends data before the FIN, and Redis runs what it read
//     before it sees the close); their replies are dropped. A cut or a
//     crash loses what was in flight.
//   - go-redis runs with DisableIdentity (no CLIENT SETINFO), maintenance
//     notifications disabled (their auto mode resolves the address in
//     DNS, which would leave the bubble), RESP2 (HELLO 2; with RESP3 it
//     peeks for push notifications before every reply, 6 % of the CPU;
//     the library's commands get the same replies) and 1 KiB connection
//     buffers instead of 32 KiB (half of a run's allocations), and a pool
//     of 64 connections per client and node, never exhausted: go-redis
//     waits for a pool turn on a timer from a process-wide sync.Pool, and
//     a timer made in one seed's bubble and reused in another's is a fatal
//     error ("select on synctest channel from outside bubble"; it happened
//     with 10 while dials to a restarting node retried). Its log is
//     silenced in tests.
//   - string.match in scripts: the library's three patterns run as
//     precompiled Go regexps written to match what the Lua patterns
//     match (TestMatchPatterns compares them with gopher-lua's on 3,000
//     subjects); any other pattern goes to gopher-lua's. The main chunk
//     of a script that never names "arg" gets no Lua 5.0 "arg" table.
//   - Wake scenarios: a connection's handshake (HELLO 2 and its reply,
//     message 0 each way) takes no virtual time and meets no fault.
//     go-redis's PubSub dials and handshakes in conn(), called holding
//     the PubSub's mutex (Subscribe, Unsubscribe, ReceiveTimeout's
//     connWithLock, the reconnect in releaseConn), and the wake hub runs
//     a reader and a writer on one PubSub: while one of them waits for
//     the HELLO reply, the other waits on the mutex, which is not a
//     durable block, so the bubble's clock would stop with the reply
//     still due (runs hung in real time). Dials were instant already. A
//     subscription connection cut mid-run reconnects at once, then (its
//     SUBSCRIBE and the confirmations) with the link's delays. A paused
//     node would hold the handshake: the Wake scenarios have no pauses.
//   - Process-wide objects cannot cross seeds' bubbles, so every
//     Watchdog is made in its run (WithKeeper on every Locker and
//     Barrier): Locker.Do's process-wide default keeper is not exercised.
//   - The Cluster: three masters, no replicas, so no failover, no
//     replica reads (READONLY) and no CLUSTERDOWN; the slots never move
//     (no resharding: ASK and TRYAGAIN are never sent, MOVED only refuses
//     a misrouted key, and go-redis's reload after a MOVED learns nothing
//     new); no cluster bus, gossip or node failure detection (a paused
//     master is not failed over); CLUSTER SHARDS is answered in its RESP2
//     shape with a subset of the fields; multi-key commands are checked
//     for the few Redis commands the library and go-redis send (other
//     commands are taken to have their key first). A ClusterClient
//     fetches COMMAND holding a mutex that its other commands wait for,
//     and a goroutine waiting on a mutex stops synctest's clock: a
//     COMMAND reply held by a paused master hung a run in real time. So
//     every Cluster client sends one PING while the run sets up, on a
//     quiet network (no spike, loss or fault; a pause drawn at the very
//     start still delays it), which loads the topology and COMMAND once.
//   - A lost message models a hole in a TCP stream only for the message
//     itself: a later request or reply on the same connection still
//     arrives. In a pipeline of several commands that would misalign the
//     replies (go-redis would read the next reply as the lost one's); the
//     workloads never pipeline more than one command per connection (a
//     client's watchdog keeps one lock per strategy at a time: a Cluster
//     batch has one call per master).
//   - Each Dispatch is atomic per node (a node mutex), like Redis's single
//     thread; a node's command cost is zero virtual time. One goroutine
//     per run (sched.go) delivers every message at its virtual time, in
//     (time, send order) order, and runs the nodes' commands.
//
// # Determinism
//
// The schedule and every message's delay and loss are functions of the
// seed alone, and so are the workload's choices (one PCG per client).
// What no seed controls: Locker.Lock draws its retry jitter from
// math/rand/v2's global source, so the workload calls Lock with a 1 ns
// retry delay and a bounded number of attempts (the jitter is then at most
// 1 ns) and backs off between Lock calls with its own seeded draws;
// tokens come from crypto/rand (only their equality matters to the
// scripts); go-redis's ClusterClient picks the node it asks CLUSTER SLOTS
// and COMMAND with math/rand (every master answers the same); and when goroutines become runnable at the same virtual
// instant the Go scheduler picks their order, which could change which
// pooled connection go-redis hands out and so which per-message draws a
// command gets. Measured with -replays (client-level history: every grant,
// extension, release, register write and fault with its virtual time;
// node-level lines left out because they carry tokens): a failing seed
// (seed 29 of quorum5-restart with the retry/undo fix reverted) failed 10
// of 10 times with one distinct history, and seed 29 on main passed 10 of
// 10, also with one history (those seeds predate the per-scenario fault
// horizons: today's schedules differ). Before the retries were made
// deterministic, seed 8 of quorum5-fenced gave 10 distinct histories in
// 10 runs. Since one goroutine delivers every message (sched.go), ties
// at one virtual instant go in send order. Measured since, -replays 10
// each: quorum3-extend seed 9814 with the maxTTL bound of Extend reverted
// failed 10 of 10 at 59e7f42 (4 distinct histories), seed 15455 9 of 10
// at 66c8697 (10 histories); barrier seed 10542 on main
// failed 10 of 10 (1 history); watchdog-mixed seed 2478 with a batch
// renewal counting validity from its reply failed 10 of 10 (1 history);
// barrier seed 1373 with the Barrier's cancel-on-loss removed failed 10
// of 10 (10 histories: the Barrier's own timers and retries). The same
// 1,000 seeds of quorum5-fenced gave 28 and then 30 hazards in two runs of
// one binary. watchdog-mixed with three lanes per client running at once
// replays worse: seeds 27, 111 and 39 gave 10 distinct histories in 10
// runs each (lanes share a watchdog and reach it at the same virtual
// instants in scheduler order), and a failure came back in 3 to 7 of
// 10; rerun a failing seed until its history shows the failure. Runs are not bit-identical; a failure has so far replayed
// every time, but check a seed with -replays before relying on it.
//
// The wake scenarios replay worse still: seed 7 gave 7 (wake-single)
// and 10 (wake-quorum3) distinct client-level histories in 10 runs, all
// passing. The waits themselves are not random there (the backoff is
// longer than every TTL, so no wait ends at a jittered draw), but each
// client has a hub with two goroutines of its own per node, whose reads,
// writes and wakes at one virtual instant go in scheduler order, and
// wake-quorum3's undo storm (see Findings; paced since) multiplied the attempts that
// race.
//
// # Running
//
// chaos is a module of its own (github.com/redlease/redlease/chaos): from
// the repository's root, go -C chaos runs the go command there.
//
//	go -C chaos test ./sim                      # 200 seeds (30 under -race)
//	go -C chaos test ./sim -run 'TestSim$' -seeds 10000   # what make test adds
//	go -C chaos test ./sim -run 'TestSim$' -scenario quorum5-fenced -seed 204 -v
//	go -C chaos test ./sim -run 'TestSim$' -scenario barrier -seed 10542 -replays 10
//
// -seed replays one seed and prints its schedule and its history (every
// command each node applied, every grant, extension, release, register
// write and effect). A failing seed prints that command line. -workers
// sets how many seeds run at once (default 4 per GOMAXPROCS: a run spends
// much of its wall time with every goroutine of its bubble blocked, and
// one worker per CPU left a CPU idle); -progress logs a line every 10 s;
// -stopfail stops at the first failure; -inv keeps only some invariants.
// make test runs the race-enabled default (30 seeds) with every package
// and then this package without -race over 10,000 seeds; make sim runs
// SIM_SEEDS (100,000) with a progress line.
//
// # Cost
//
// The runs' CPU went to a goroutine per message delivery growing its
// stack through miniredis and gopher-lua (17 %), fresh 4 KiB buffers per
// redis.call and go-redis's 32 KiB per connection (half the
// allocations), string.match compiling its pattern on every call (10 %),
// RESP3 push peeking (6 %), Lua's per-call "arg" table and GC. What is
// left is go-redis and the library (a quorum.New costs 480 KiB: four
// 4,096-slot queues), the Lua VM, and miniredis. Measured on this 2-core
// VM while other sessions kept its load average at 5–7 (so wall times
// are pessimistic; CPU time is the steadier figure):
//
//	/tmp/sim.test -test.run 'TestSim$' -scenario quorum5-fenced -seeds 1000
//	(go -C chaos test -c -o /tmp/sim.test ./sim)
//
// before (cc0e868: 6 ops per client, 8.5 grants per seed): 27–33 seeds/s,
// 24.5–24.8 ms of user CPU per seed; after (4 ops, faults within the
// workload, 6.4 grants per seed): 89–160 seeds/s, 8.5–9.9 ms of user CPU
// per seed, so 200–235 seeds/s on two idle cores (at load 2.5, 115
// seeds/s with 8.5 ms of CPU per seed, the base 50 seeds/s with 24.6). Over the whole rotation
// make test's 10,000 seeds (go -C chaos test -count=1 ./sim/ -run 'TestSim$'
// -seeds 10000) took 91–94 s of wall time at load 6–8.6 and 62–72 s of
// user CPU: 31–36 s on two idle cores, by CPU time; not measured on an
// idle machine. The -race run (go -C chaos test -race -count=1 ./sim, 30
// seeds and the other tests) took 8 s.
//
// # Seeds on main
//
// 200,000 seeds of the rotation at 3c08b2e (25,000 per scenario; 20 min
// 42 s, 161 seeds/s): no failure but the Barrier finding below, since
// fixed (9 seeds
// of barrier, all effect-twice after a Do that returned ErrNotOwner:
// 10542, 47030, 48670, 63862, 70150, 86638, 97958, 157358, 182614), 5,524
// hazards: overlap after clock-skew 2,348, after clock-jump 1,465, after
// an empty or snapshot restart without the rule 865; fence-order after a
// restart under the rule (fence order is not promised) 3,825, after
// clock-jump 322, after clock-skew 2; stale-accepted after clock-jump 2,
// clock-skew 1, restart 1. No hazard in watchdog-mixed, barrier or
// quorum3-extend (their faults are inside the assumptions); 12,728
// repeated Barrier effects after ErrRunCancelled or ErrNotRecorded. Then
// 25,000 seeds of quorum3-extend as it is now (59e7f42): no failure. With
// both findings fixed, 60,000 more seeds at 66c8697 (-first 200001; 7 min
// 24 s beside other runs): no failure, 1,645 hazards (fence-order after a
// restart under the rule 1,081, after clock-jump 69; overlap after
// clock-skew 675, clock-jump 503, restart 249; stale-accepted after
// restart 1), and the nine barrier seeds above now pass.
//
//	go -C chaos test -count=1 -timeout 0 ./sim -run 'TestSim$' -seeds 200000 -progress -v
//
// Badkey and errnode (watchdog-mixed at 166182f, before the Cluster lane;
// 5,000 seeds, 21 s):
//
//	go -C chaos test -count=1 ./sim -run 'TestSim$' -scenario watchdog-mixed -seeds 5000 -v
//
// no failure, no hazard. Healthy holds 25,581, lost 160 (0.63 %);
// bystanders of badkey/errnode 10,943, lost 84 (0.77 %); holds whose
// token was replaced on a quorum 1,197: lost while fn ran 938, Err naming
// WRONGTYPE 882 (the rest ended first or lost by deadline), none believed
// held past the moment a quorum stopped holding it; replaced on a
// minority only 462, lost 80 (17 %: those quorum locks kept a bare
// majority beside other faults); renewals answered by errnode 12,375, at
// most 10 per lock per node per virtual second, at most 57 script calls
// per erroring node per virtual second; the single node's renewals never
// came closer than the retry delay. A first version of the gap check
// timed calls at the node and failed 8 of 300 seeds: a delayed request
// arriving just before the next round's, not the library. The healthy
// losses have not been examined one by one: whether they exceed what the
// background loss and spikes explain is open ("healthy lock lost" lines in
// -seed replays name them).
//
// Healthy losses explained (watchdog-mixed with the Cluster lane, this
// commit's tree; 3,000 seeds, 2 min 12 s at load 5–10, 52.6 s of user
// CPU):
//
//	go -C chaos test -count=1 ./sim -run 'TestSim$' -scenario watchdog-mixed -seeds 3000 -v
//
// healthy holds 36,403, lost 371: granted on a bare majority and then a
// minority faulted among the granting nodes 114; a message between the
// client and a node it needed lost while fn ran 190 (a renewal's
// request or reply, or a new connection's HELLO: the call waits until
// its deadline, the retry delay, a quarter interval, is longer than the
// tenth a Cluster shard leaves, and a single node has no other node to
// answer); a message lost before the grant while a go-redis call without
// ContextTimeoutEnabled still waited on it 23 (see Findings); validity at
// grant too short for three round trips at the delay drawn 44 (24 of
// them with a spike; the others granted with a few milliseconds left);
// TTL too short 0. Protected 27,667, lost 0. The first version counted a
// quorum lock healthy when faults touched a minority of all five nodes,
// whatever nodes granted it (41 of the first 1,000 seeds' losses, seed
// 111 among them), and ignored a lost HELLO (four Cluster locks whose
// renewal's new connection lost its HELLO reply, seed 461).
//
// The wake scenarios (issue 16, must-show 5), at the commit that added
// them:
//
//	go -C chaos test -count=1 ./sim -run 'TestSim$' -scenario wake-single -seeds 50000 -v
//
// no failure, no hazard (3 min 38 s at load 8–10, 108 s of user CPU):
// 600,000 grants, 512,176 handoffs with a client waiting, 423,134 of them
// granted within 5 ms of the release; with no pub/sub fault around them
// 181,866, 171,554 within 5 ms, the longest 77.5 ms (a spike); with one,
// the longest 287.8 ms (a lost push: the holder's TTL ran out).
//
//	go -C chaos test -count=1 ./sim -run 'TestSim$' -scenario wake-quorum3 -seeds 50000 -v
//
// no failure, no hazard (3 min 33 s at load 2–4, 415 s of user CPU, 8.3 ms
// per seed): 300,000 grants, 234,494 handoffs, 205,208 within 5 ms; with
// no pub/sub fault 63,551, 55,271 within 5 ms, the longest 85.1 ms; with
// one, the longest 193.2 ms. An earlier wake-quorum3 with four Lock calls
// per client (50,000 seeds, 34 min at load 10–14, 846 s of user CPU):
// no failure either.
//
// make test's 10,000 seeds of the rotation with both wake scenarios in it,
// against the tree before them, two interleaved rounds each while the load
// fell from 8 to 2 (go test -c, then the binary with -test.run 'TestSim$'
// -seeds 10000): with them 68.9 and 71.4 s of user CPU (69.8 and 37.0 s
// wall), before 73.0 and 67.2 s (62.7 and 34.9 s wall); no failure. The
// wake seeds cost wake-single 2 ms and wake-quorum3 8.4 ms of user CPU
// each, against 4 ms for quorum3-plain and about 7 ms for the rotation's
// mean.
//
// # Power
//
// Library defects put back on a scratch copy, and how far the simulator
// went to find them. The three no-double-grant fixes were
// measured at this scenario list with make test's own command plus
// -stopfail, from eight (c) or five (a, b) starting seeds (-first 1,
// 100001, 200001, …), on the 2-core VM at load 6–10. Each defect was put
// back with a go build overlay (f.json replacing the fixed file by a copy
// without the fix), so nothing reverted is ever committed:
//
//	go -C chaos test -count=1 ./sim/ -run 'TestSim$' -seeds 10000 -stopfail -first 100001 -overlay /tmp/f.json
//
// The findings:
//
//   - (c) Extend past the delayed-restart max TTL (8a56ae8's bound: the
//     checkTTL calls of quorum.Strategy.Extend and ExtendBatch removed):
//     quorum3-pastmax found it every time, after 24–676 seeds and
//     0.23–6.3 s (seeds 413, 100025, 200672, 300284, 400121, 500021,
//     600614, 700136). Over seeds 1–20,000 of quorum3-pastmax alone, 485
//     failed (2.4 %), every one by overlap; each of the 20 runs of 1,000
//     consecutive seeds had 16–34 failures, the first at its 1st–159th
//     seed, so a make test run (about 1,100 of the scenario's seeds)
//     misses it with probability about 0.976^1100 ≈ 1e-12. Seeds 413, 48
//     and 100025 replayed 10 of 10 (one history each); seed 413 passes
//     10 of 10 with the bound. In seed 413 clients 0 and 2 are cut off
//     from node 0; client 2's lock, extended past the max TTL on nodes 1
//     and 2, is still believed held when node 2, restarted empty at
//     194 ms, has sat out its 100 ms, and client 1 is granted on nodes 0
//     and 2 at 324 ms (47.6 ms of overlap). quorum3-extend, the scenario
//     built for it first, found it in none of seeds 1–20,000 at this tree
//     (2 min 13 s; earlier trees below).
//   - (a) one token for every attempt of Lock (the retry/undo fix:
//     Locker.retry passing its base token to every attempt):
//     quorum3-restart, overlap, after 51–356 seeds and 0.6–3.5 s (seeds
//     291, 100047, 200055, 300360, 400188).
//   - (b) a failed Release that leaves the lock valid (Lock.Release
//     ending the hold only once the release is confirmed): single, after
//     1–2 seeds and under 0.05 s (fence-order, release-kept-valid); with
//     -inv overlap,fence-order,stale-accepted, after 1–18 seeds and
//     0.05–0.44 s (single, quorum3-restart, quorum5-fenced,
//     quorum5-restart).
//
// Replay (c)'s first seed:
//
//	go -C chaos test ./sim -run 'TestSim$' -scenario quorum3-pastmax -seed 413
//
// With the bound in place, seeds 1–20,000 of quorum3-pastmax pass, no
// hazard (5 min 6 s at load 9; 147 s of user CPU, 7.4 ms per seed, the
// rotation's mean being about 6.3). make test's 10,000 seeds with it in
// the rotation took 60.6–69.9 s of user CPU (95 s of wall time at load
// 7–9), against 63.1–64.9 s for the rotation without it (562bfdf) in the
// same hour: no change beyond the noise, about 30–35 s on two idle cores.
//
// Earlier figures (-stopfail, 2 workers, under the same load):
//
//   - Extend past the delayed-restart max TTL (8a56ae8's bound reverted:
//     quorum.Strategy.Extend without its checkTTL call): on a worktree at
//     66c8697, quorum3-extend seed 15455 after 15,456 seeds and 4 min 7 s
//     (beside another run); at 59e7f42 (before 2a5388f changed Extend),
//     seed 9814 after 9,814 seeds and 75 s — a lock extended to 150 ms
//     past the 100 ms max TTL on two nodes, one of them restarted empty
//     and voting again 100 ms after its first contact, a second client
//     granted while the first still held. An earlier version of the
//     scenario (pauses, any restart mode, half the extensions past the
//     max TTL) took 21,000–23,500 seeds. Both seeds pass on main.
//   - A batch renewal that counts validity from its reply instead of its
//     request (quorum/batch.go): watchdog-mixed seed 2478 after 2,478
//     seeds and 18 s, held-past-expiry.
//   - Head of line in the watchdog (renew's lanes merged into one and
//     redlease.ExtendAll extending strategy groups one after another
//     under one deadline, on a scratch copy of this commit's tree):
//     watchdog-mixed seed 39 after 40 seeds and 2.2 s (-inv healthy-lost
//     -stopfail -workers 4), healthy-lost: a Cluster lock on a healthy
//     master lost while the single node was paused; 4 of 10 replays
//     fail (10 of 10 pass on this tree). go -C chaos test ./sim -run
//     'TestSim$' -scenario watchdog-mixed -seed 39 -replays 10 -inv
//     healthy-lost
//   - failover's WAIT check reverted (internal/primary replicated()
//     always nil; at a604e0a, 4 workers, a loaded machine): failover
//     seed 27 after 26 seeds in 0.3 s (fence-order: a grant no replica
//     had, its fence counter lost with the promotion; 5 of 5 replays);
//     with -inv overlap, seed 11673 after 11,673 seeds and 1 min 48 s.
//   - Not found: the Locker tracking a failover grant only once its
//     reply is back (locker.go: Track after Acquire, the order
//     TestGrantInFlightDuringFailoverIsRevoked pins): 30,000 failover
//     seeds (6 min 46 s), and 15,000 more with a slow primary across
//     every other promotion, passed. An untracked grant in flight at the
//     revocation stays believed only until its Until unless the watchdog
//     extends it on the new primary, and failover-kept's bound (at least
//     400 ms) outlasts most such holds: the invariant checks the bound,
//     not that the Watcher revoked that lock.
//   - The Barrier not cancelling a handler whose lock was lost
//     (idempotency/barrier.go, watch): barrier seed 1373 after 1,373
//     seeds and 6.5 s, effect-twice.
//
// # Findings
//
// Defects the simulator found, each with a regression test in
// findings_test.go (they run by default; findingsOnly and -findings are
// for a defect still open on main, of which there is none now):
//
//   - Fixed in 69a7671: an undecided Extend with a TTL shorter than the
//     validity left kept the lock's old Until (TestFindingShortExtend),
//     and Lock.Lost first called after the deadline closed its channel
//     twice (TestFindingLostAfterDeadline).
//   - Fixed in 2a5388f: an Extend that succeeded after an undecided Extend
//     to a shorter TTL set Until from its own TTL and dropped the cap the
//     undecided one set, while the undecided request could still land
//     last on the nodes and expire the key at its shorter TTL: a double
//     grant with no fault at all (TestFindingExtendAfterUndecided; found
//     as seed 2586 of an earlier quorum3-extend).
//   - Fixed in 127e250: a Barrier handler that ran and succeeded, whose
//     result reached the store only after its lock had run out there (a
//     slow store, a go-redis client without ContextTimeoutEnabled that
//     waits for the reply past the lock's Until) and another caller had
//     taken the request over and run the handler again, got ErrNotOwner
//     ("its result was not stored"; the Consumer did not ack it), not
//     ErrNotRecorded ("its effect may have happened")
//     (TestFindingBarrierNotOwnerAfterEffect; found as seed 10542 of
//     barrier, effect-twice, 10 of 10 replays; 9 of the 200,000 seeds).
//
// Fixed on main (internal/wake's UndoNotice; TestFindingUndoPublishStorm
// runs always): a refused quorum waiter undoes the grants it got with the
// release script, which published on the key's wake channel like a
// release, so every other waiter woke and tried again at once, took the
// same free nodes, was refused, undid, published... For as long as the
// lock was held on a bare majority (a node missed the grant, or
// restarted), waiters took turns acquiring and undoing that node, each
// round a fan-out to every node. Found by the first wake-quorum3 runs:
// seed 7 applied 981 acquisitions for 9 grants; the test counted 1,030
// acquisitions in 200 ms of a hold with two waiters; against three
// redis-server processes, 12,893 EVALSHA calls in 1.3 s. No invariant was
// broken (the storm ends at the release). An undo that publishes nothing
// ends the storm but leaves a split vote (every waiter refused, every one
// undoing) to the waiters' backoff (the root package's
// TestWaitersShareOneConnectionPerNode/quorum, 10 s backoff, failed in a
// clean-clone CI with it). Now an undo publishes wake.UndoNotice, which a
// waiter answers after a jittered pause that doubles with each one since
// the last release notice (5 ms up to 1 s): a split vote is retried
// within milliseconds, staggered, and a storm dies down (45 acquisitions
// in the test's 200 ms, then about one attempt per waiter per second).
//
// Fixed on main (d5b4e4a, with a test against redis-server in single's
// bounded_test.go): single's ExtendBatch on a plain client was not
// bounded by its ctx (Acquire, Extend and Release
// are, through primary.call; the Cluster path returns at its shard
// deadline). On a go-redis client without ContextTimeoutEnabled (the
// default), a renewal whose request or reply is lost waits for the
// ReadTimeout (3 s) and go-redis's retries while keeping one of its
// strategy's watchdog call slots (renew.WithMaxCalls, 2); two such calls
// stop every renewal of that strategy, locks granted after the node
// recovered included. Seed 511: client 2's single client has no context
// timeouts; renewals of its s0 locks lost a request at 130.9 ms and a
// reply at 232.4 ms (a loss fault on node 5 until 405 ms); its s1 lock
// granted at 495.7 ms on a healthy node got no renewal sent and was
// lost at 567 ms (go -C chaos test ./sim -run 'TestSim$' -scenario
// watchdog-mixed -seed 511 -v, "lost request", "lost the reply"; the
// histories vary from run to run). healthy-lost still excludes holds
// with a message lost within 12 s before the grant and counts them apart
// (with the fix that look-back could shrink to the renewal timeout; not
// done yet).
//
// The default workload steps around nothing now. Lock.Lost is still
// called after Valid unless -lostfirst (the order of the fixed panic),
// and extensions never shorten unless a scenario sets ShortExtends.
package sim
