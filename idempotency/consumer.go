package idempotency

import (
	"context"
	"errors"

	"github.com/redlease/redlease"
)

// Consumer makes a message handler take effect once per message, for
// at-least-once queues (Redis Streams, Kafka, SQS): key it on a stable
// message or business id, not on a delivery id that changes on redelivery.
// Message ids have a namespace of their own in the Barrier (see WithPrefix):
// the message "42" and the request key "msg:42" are different requests.
type Consumer struct {
	b *Barrier
}

// NewConsumer handles messages through b.
func NewConsumer(b *Barrier) *Consumer { return &Consumer{b: b} }

// Handle runs h for id once and says whether to ack the message:
//
//   - ack true, err nil: done now or before (a duplicate); ack it.
//   - ack true, err a Final or stored error: the outcome is definitive and
//     recorded; ack it, it must not run again.
//   - ack false, err ErrInProgress: another consumer is handling it right
//     now; do not ack — if that consumer dies, redelivery (XAUTOCLAIM)
//     brings it back, and its lock will have expired by then.
//   - ack false, other err: h failed transiently and the record was
//     released; do not ack, let it be redelivered. An empty id is
//     redlease.ErrInvalid.
func (c *Consumer) Handle(ctx context.Context, id string, h Handler) (ack bool, err error) {
	return c.handle(ctx, Request{Key: id}, h)
}

// HandlePayload is Handle that also fingerprints the message payload: a
// message re-published under the same id with a different payload gets
// ErrMismatch (ack false) instead of a silent replay.
func (c *Consumer) HandlePayload(ctx context.Context, id string, payload []byte, h Handler) (ack bool, err error) {
	return c.handle(ctx, Request{Key: id, Fingerprint: PayloadHash(payload)}, h)
}

func (c *Consumer) handle(ctx context.Context, req Request, h Handler) (ack bool, err error) {
	switch {
	case c == nil || c.b == nil:
		return false, redlease.Invalid("idempotency: Consumer without a Barrier")
	case req.Key == "":
		return false, redlease.Invalid("idempotency: empty message id")
	}
	_, err = c.b.do(ctx, nsMessage, req, h, 0)
	var final *FinalError
	var stored *StoredError
	switch {
	case err == nil, errors.As(err, &final), errors.As(err, &stored), errors.Is(err, ErrResultNotStored):
		return true, err
	}
	return false, err
}
