-- Migration 489: a fork carries its source's pins.
-- Forks made before this took the protocol's defaults for authorization (readers and writers
-- "*"), placement and content class, whatever their source pinned, so anyone of the tenant could
-- read a source's records through its fork. Every fork now takes its source's authorization,
-- redaction, placement and content class at creation; this gives each existing fork those of
-- its chain's root (the stream at the top of its chain, which is no fork: before this no fork
-- could be given any of them but the defaults, or, for redaction, its source's, so the root's
-- are what the chain pins). The same PUT of such a fork again then matches it as it would a
-- new one. Only the definition is changed; the journal keeps what the creation said.
-- The bound on the walk only guards against a cycle, which no creation can make.
WITH RECURSIVE up (tenant, run_id, stream_id, source_run_id, source_stream_id, n) AS (
    SELECT tenant, run_id, stream_id, source_run_id, source_stream_id, 0 FROM stream_forks
    UNION ALL
    SELECT up.tenant, up.run_id, up.stream_id, f.source_run_id, f.source_stream_id, up.n + 1
    FROM up
    JOIN stream_forks f
      ON f.tenant = up.tenant AND f.run_id = up.source_run_id
     AND f.stream_id = up.source_stream_id
    WHERE up.n < 100000
), roots AS (
    SELECT DISTINCT ON (tenant, run_id, stream_id)
           tenant, run_id, stream_id, source_run_id AS root_run_id,
           source_stream_id AS root_stream_id
    FROM up
    ORDER BY tenant, run_id, stream_id, n DESC
), pinned AS (
    SELECT r.tenant, r.run_id, r.stream_id,
           jsonb_build_object(
               'authorization', d.definition -> 'authorization',
               'redaction', d.definition -> 'redaction',
               'placement', d.definition -> 'placement',
               'content_class', d.definition -> 'content_class'
           ) AS pins
    FROM roots r
    JOIN streams root
      ON root.tenant = r.tenant AND root.run_id = r.root_run_id
     AND root.stream_id = r.root_stream_id
    CROSS JOIN LATERAL (SELECT convert_from(root.definition, 'UTF8')::jsonb AS definition) d
)
UPDATE streams s
SET definition = convert_to((convert_from(s.definition, 'UTF8')::jsonb || p.pins)::text, 'UTF8')
FROM pinned p
WHERE s.tenant = p.tenant AND s.run_id = p.run_id AND s.stream_id = p.stream_id
  AND convert_from(s.definition, 'UTF8')::jsonb || p.pins
      IS DISTINCT FROM convert_from(s.definition, 'UTF8')::jsonb;
