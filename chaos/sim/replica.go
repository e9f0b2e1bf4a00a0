package sim

// replLink is a primary's replication stream to its replica: the write
// commands sent and the ones the replica applied.
type replLink struct {
	sent, applied int
}

// replicateLocked feeds a write command to the replica (see the package
// doc's list of gaps: commands are replayed, not their effects).
func (n *Node) replicateLocked(args []string) {}

// waitLocked answers WAIT: the number of replicas that applied every write
// sent so far.
func (n *Node) waitLocked() int {
	if n.replica != nil && n.repl.applied >= n.repl.sent {
		return 1
	}
	return 0
}
