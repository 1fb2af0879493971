"""The marks of subscription links with records past their cursors (migration 0508,
`ds_subscription_pending`), as every writer of them writes them: appends and forks
(stream_writes.py, streams.py), and the scheduler and decisions (subscriptions.py)."""

from __future__ import annotations

# Marks for the links of the row set `{links}` (tenant, subscription_id, run_id, stream_id,
# acked, head: a link, its cursor and its stream's head) that stand past their cursors. In the
# marks' key order, as every writer of marks takes them. A mark already at the head (a write
# that moved no head: a close, an ack, a deletion kept for forks) is left untouched: an upsert
# that changes nothing still locks the row, and a run's deletion so held a mark a decision
# waited for while the deletion's erasures waited for that decision's subscription.
MARK = """
    INSERT INTO ds_subscription_pending AS p (tenant, subscription_id, run_id, stream_id, head)
    SELECT m.tenant, m.subscription_id, m.run_id, m.stream_id, m.head
    FROM ({links}) AS m
    WHERE m.acked < m.head
      AND NOT EXISTS (
          SELECT 1 FROM ds_subscription_pending q
          WHERE (q.tenant, q.subscription_id, q.run_id, q.stream_id)
              = (m.tenant, m.subscription_id, m.run_id, m.stream_id)
            AND q.head >= m.head)
    ORDER BY m.tenant, m.subscription_id, m.run_id, m.stream_id
    ON CONFLICT (tenant, subscription_id, run_id, stream_id)
    DO UPDATE SET head = excluded.head WHERE p.head < excluded.head"""

# The links of the streams a statement wrote (`written`: tenant, run_id, stream_id, head).
# (`OFFSET 0`: each stream's links looked up by its key, never a pass over every link,
# whatever the planner knows of the table.)
MARK_WRITTEN = MARK.format(
    links="""SELECT w.tenant, l.subscription_id, w.run_id, w.stream_id, l.acked, w.head
             FROM written w
             CROSS JOIN LATERAL (
                 SELECT subscription_id, acked FROM ds_subscription_links
                 WHERE tenant = w.tenant AND run_id = w.run_id AND stream_id = w.stream_id
                 OFFSET 0) l"""
)
