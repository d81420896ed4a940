// kafkajs against Canopy. Run with `node --test` (tests/compat/run.sh does),
// with BOOTSTRAP=host:port of a running broker.
//
// What kafkajs covers here:
//   * admin.createTopics (waitForLeaders), admin.fetchTopicMetadata,
//     admin.listTopics, admin.describeCluster (metadata: topics + brokers);
//   * producer.send with keys and headers, acks=-1, idempotent:false (Canopy
//     has no InitProducerId yet), the Java-compatible DefaultPartitioner; the
//     acks' base offsets give the partition and offset of every record;
//   * admin.fetchTopicOffsets (ListOffsets earliest + latest): low 0 and high
//     = records per partition, 10,000 in total.
// What kafkajs does NOT cover here, and why:
//   * consuming. kafkajs has no assign() API: its only consumer joins a
//     consumer group (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//     OffsetFetch/OffsetCommit), and Canopy has no group coordinator yet. So
//     the records kafkajs produced are read back with kcat (librdkafka), by
//     explicit partition from the beginning, and checked here record by
//     record against what kafkajs acked. Once groups land, replace that with a
//     kafkajs consumer.
'use strict'

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const { Kafka, Partitioners, logLevel } = require('kafkajs')

const BOOTSTRAP = process.env.BOOTSTRAP
const N_RECORDS = 10000
const N_PARTITIONS = 3
const SEND_CHUNK = 500
const TOPIC = `compat.kafkajs.${Date.now()}.${process.pid}`
const KCAT = process.env.KCAT || 'kcat'

const record = i => {
  const n = String(i).padStart(5, '0')
  return {
    key: `k-${n}`,
    value: `v-${n}-` + 'x'.repeat(i % 97),
    headers: { seq: String(i), src: 'compat' },
  }
}

const kafka = new Kafka({
  clientId: 'compat-kafkajs',
  brokers: [BOOTSTRAP || 'BOOTSTRAP-not-set:0'],
  logLevel: logLevel.WARN,
  connectionTimeout: 10000,
  requestTimeout: 30000,
  retry: { retries: 3 },
})
const admin = kafka.admin()
let producer = null
const state = { created: false, acked: null }

after(async () => {
  if (producer) await producer.disconnect().catch(() => {})
  await admin.disconnect().catch(() => {})
})

test('BOOTSTRAP is set', () => {
  assert.ok(BOOTSTRAP, 'BOOTSTRAP=host:port is not set (run via tests/compat/run.sh)')
})

test('admin.createTopics creates a topic with 3 partitions', { timeout: 60000 }, async () => {
  await admin.connect()
  const created = await admin.createTopics({
    topics: [{ topic: TOPIC, numPartitions: N_PARTITIONS, replicationFactor: 1 }],
    waitForLeaders: true,
    timeout: 10000,
  })
  assert.equal(created, true, 'createTopics returned false (topic already existed?)')
  const md = await admin.fetchTopicMetadata({ topics: [TOPIC] })
  assert.equal(md.topics.length, 1)
  assert.equal(md.topics[0].name, TOPIC)
  assert.deepEqual(md.topics[0].partitions.map(p => p.partitionId).sort(), [0, 1, 2])
  state.created = true
})

test('producer sends 10,000 keyed records with headers', { timeout: 120000 }, async () => {
  assert.ok(state.created, 'topic was not created')
  // Wrap the Java-compatible default partitioner to learn where each key went.
  const chosen = new Map()
  const createPartitioner = () => {
    const inner = Partitioners.DefaultPartitioner()
    return args => {
      const p = inner(args)
      chosen.set(args.message.key.toString(), p)
      return p
    }
  }
  producer = kafka.producer({ idempotent: false, allowAutoTopicCreation: false, createPartitioner })
  await producer.connect()

  const acked = new Map() // key -> [partition, offset]
  for (let start = 0; start < N_RECORDS; start += SEND_CHUNK) {
    const messages = []
    for (let i = start; i < Math.min(start + SEND_CHUNK, N_RECORDS); i++) messages.push(record(i))
    const res = await producer.send({ topic: TOPIC, acks: -1, timeout: 30000, messages })
    const base = new Map()
    for (const r of res) {
      assert.equal(r.topicName, TOPIC)
      assert.equal(r.errorCode, 0, `produce error ${r.errorCode} on p${r.partition}`)
      base.set(r.partition, BigInt(r.baseOffset))
    }
    // Records of one send to one partition form one batch, in message order.
    const next = new Map()
    for (const m of messages) {
      const p = chosen.get(m.key)
      assert.ok(base.has(p), `no ack for partition ${p} of ${m.key}`)
      const off = base.get(p) + (next.get(p) || 0n)
      next.set(p, (next.get(p) || 0n) + 1n)
      acked.set(m.key, [p, Number(off)])
    }
  }
  assert.equal(acked.size, N_RECORDS)
  for (let p = 0; p < N_PARTITIONS; p++) {
    const offs = [...acked.values()].filter(([q]) => q === p).map(([, o]) => o).sort((a, b) => a - b)
    assert.ok(offs.length > 0, `no record went to p${p}`)
    assert.deepEqual(offs, offs.map((_, i) => i), `p${p}: acked offsets not dense from 0`)
  }
  state.acked = acked
})

test('admin.fetchTopicOffsets: low 0, high = records per partition, 10,000 in total', async () => {
  assert.ok(state.acked, 'produce did not complete')
  const offsets = await admin.fetchTopicOffsets(TOPIC)
  assert.deepEqual(offsets.map(o => o.partition).sort(), [0, 1, 2])
  let total = 0
  for (const o of offsets) {
    const expected = [...state.acked.values()].filter(([q]) => q === o.partition).length
    assert.equal(o.low, '0', `p${o.partition} low ${o.low}`)
    assert.equal(o.high, String(expected), `p${o.partition} high ${o.high}, acked ${expected}`)
    total += Number(o.high)
  }
  assert.equal(total, N_RECORDS)
})

test('records read back by partition (via kcat) match what kafkajs acked', { timeout: 120000 }, () => {
  assert.ok(state.acked, 'produce did not complete')
  const which = spawnSync(KCAT, ['-V'], { encoding: 'utf8' })
  assert.ok(!which.error && which.status === 0, `kcat is needed to read back (kafkajs has no assign()): ${which.error || which.stderr}`)
  const seen = new Set()
  for (let p = 0; p < N_PARTITIONS; p++) {
    const r = spawnSync(KCAT, ['-b', BOOTSTRAP, '-C', '-t', TOPIC, '-p', String(p), '-o', 'beginning', '-e', '-J', '-q',
      '-X', 'socket.timeout.ms=20000'], { encoding: 'utf8', maxBuffer: 256 << 20, timeout: 90000 })
    assert.equal(r.status, 0, `kcat -C p${p} failed: ${r.error || r.stderr}`)
    const recs = r.stdout.split('\n').filter(l => l.trim()).map(l => JSON.parse(l))
    assert.ok(recs.length > 0, `p${p} is empty`)
    let prevSeq = -1
    recs.forEach((m, idx) => {
      assert.equal(m.offset, idx, `p${p}: offsets not dense from 0 (index ${idx} has offset ${m.offset})`)
      assert.equal(m.partition, p)
      const seq = Number(m.key.slice(2))
      const exp = record(seq)
      assert.equal(m.key, exp.key)
      assert.equal(m.payload, exp.value, `p${p}@${m.offset}: value`)
      assert.deepEqual(m.headers, ['seq', exp.headers.seq, 'src', 'compat'], `p${p}@${m.offset}: headers`)
      assert.ok(!seen.has(m.key), `duplicate key ${m.key}`)
      seen.add(m.key)
      assert.deepEqual(state.acked.get(m.key), [p, m.offset], `${m.key}: acked vs read position`)
      assert.ok(seq > prevSeq, `p${p}: records not in produce order at offset ${m.offset}`)
      prevSeq = seq
    })
  }
  assert.equal(seen.size, N_RECORDS)
})

test('metadata: listTopics and describeCluster show the topic and the broker', async () => {
  assert.ok(state.created, 'topic was not created')
  const topics = await admin.listTopics()
  assert.ok(topics.includes(TOPIC), `${TOPIC} not in listTopics`)
  const md = await admin.fetchTopicMetadata({ topics: [TOPIC] })
  const t = md.topics[0]
  assert.equal(t.partitions.length, N_PARTITIONS)
  const cluster = await admin.describeCluster()
  assert.ok(cluster.brokers.length >= 1, 'no brokers')
  const [host, port] = [BOOTSTRAP.slice(0, BOOTSTRAP.lastIndexOf(':')), Number(BOOTSTRAP.slice(BOOTSTRAP.lastIndexOf(':') + 1))]
  assert.ok(cluster.brokers.some(b => b.host === host && b.port === port), JSON.stringify(cluster.brokers))
  const ids = new Set(cluster.brokers.map(b => b.nodeId))
  for (const p of t.partitions) assert.ok(ids.has(p.leader), `p${p.partitionId} leader ${p.leader} not a broker`)
})
