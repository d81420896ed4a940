// kafkajs against Canopy. Run with `node --test` (tests/compat/run.sh does),
// with BOOTSTRAP=host:port of a running broker.
//
// What kafkajs covers here:
//   * admin.createTopics (waitForLeaders), admin.fetchTopicMetadata,
//     admin.listTopics, admin.describeCluster (metadata: topics + brokers);
//   * an idempotent producer (InitProducerId, sequence numbers): send with
//     keys and headers, acks=-1, the Java-compatible DefaultPartitioner; the
//     acks' base offsets give the partition and offset of every record;
//   * admin.fetchTopicOffsets (ListOffsets earliest + latest): low 0 and high
//     = records per partition, 10,000 in total.
//   * compressed produce, read back intact: gzip (built in), snappy
//     (kafkajs-snappy) and lz4 (lz4js, pure JS, as a kafkajs codec); zstd
//     needs a native plugin and is covered by the Python clients;
//   * a transactional producer: a committed transaction with a group's
//     offsets (sendOffsets) and an aborted one; a read_committed group
//     consumer sees exactly the committed records, the group's offset is the
//     committed one;
//   * consumer groups: a group consumer reads back all 10,000 records
//     (checked record by record against the acks) and commits as it goes;
//     two members share a topic, one leaves (LeaveGroup) and the other takes
//     over from its commits with nothing consumed twice; admin.fetchOffsets,
//     describeGroups, listGroups, deleteGroups;
//   * security: produce, a group consumer and its commits over SASL_SSL with
//     SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, and over SSL with a client
//     certificate; a wrong password is refused.
'use strict'

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { Kafka, Partitioners, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs')
const SnappyCodec = require('kafkajs-snappy')
const lz4js = require('lz4js')

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  compress: async encoder => Buffer.from(lz4js.compress(encoder.buffer)),
  decompress: async buffer => Buffer.from(lz4js.decompress(buffer)),
})

const BOOTSTRAP = process.env.BOOTSTRAP
const N_RECORDS = 10000
const N_PARTITIONS = 3
const SEND_CHUNK = 500
const TOPIC = `compat.kafkajs.${Date.now()}.${process.pid}`

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
  producer = kafka.producer({ idempotent: true, maxInFlightRequests: 5, allowAutoTopicCreation: false, createPartitioner })
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

// Runs a kafkajs group consumer until `until()`; collects every message.
const startMember = async (groupId, topic, name, seen) => {
  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 500, maxWaitTimeInMs: 100, rebalanceTimeout: 20000 })
  const member = { name, consumer, assigned: [] }
  consumer.on(consumer.events.GROUP_JOIN, e => { member.assigned = (e.payload.memberAssignment[topic] || []).slice().sort() })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  await consumer.run({
    eachMessage: async ({ partition, message }) => {
      const at = `${partition}@${message.offset}`
      if (!seen.has(at)) seen.set(at, [])
      seen.get(at).push({ who: name, partition, offset: Number(message.offset), message })
    },
  })
  return member
}

const waitFor = async (cond, what, ms = 60000) => {
  const deadline = Date.now() + ms
  while (!cond()) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${what}`)
    await new Promise(r => setTimeout(r, 50))
  }
}

test('a kafkajs group consumer reads back exactly what kafkajs acked, and commits', { timeout: 120000 }, async () => {
  assert.ok(state.acked, 'produce did not complete')
  const groupId = `${TOPIC}.readback`
  const seen = new Map() // "p@offset" -> [{who, partition, offset, message}]
  const member = await startMember(groupId, TOPIC, 'reader', seen)
  try {
    await waitFor(() => seen.size >= N_RECORDS, `${N_RECORDS} records (have ${seen.size})`)
  } finally {
    await member.consumer.disconnect()
  }
  assert.equal(seen.size, N_RECORDS)
  const keys = new Set()
  const perPartition = new Map()
  for (const [at, [first, ...again]] of seen) {
    assert.equal(again.length, 0, `${at} consumed twice`)
    const { partition: p, offset, message: m } = first
    const key = m.key.toString()
    const exp = record(Number(key.slice(2)))
    assert.equal(key, exp.key)
    assert.equal(m.value.toString(), exp.value, `${at}: value`)
    assert.deepEqual(Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k, v.toString()])), exp.headers, `${at}: headers`)
    assert.deepEqual(state.acked.get(key), [p, offset], `${key}: acked vs read position`)
    assert.ok(!keys.has(key), `duplicate key ${key}`)
    keys.add(key)
    if (!perPartition.has(p)) perPartition.set(p, [])
    perPartition.get(p).push([offset, Number(key.slice(2))])
  }
  for (const [p, recs] of perPartition) {
    recs.sort((a, b) => a[0] - b[0])
    recs.forEach(([offset, seq], i) => {
      assert.equal(offset, i, `p${p}: offsets not dense from 0`)
      if (i > 0) assert.ok(seq > recs[i - 1][1], `p${p}: records not in produce order at offset ${offset}`)
    })
  }
  // The commits kafkajs made are the end of every partition.
  const [committed] = await admin.fetchOffsets({ groupId, topics: [TOPIC] })
  const ends = await admin.fetchTopicOffsets(TOPIC)
  assert.deepEqual(
    committed.partitions.map(p => [p.partition, p.offset]).sort(),
    ends.map(o => [o.partition, o.high]).sort())
  const { groups } = await admin.describeGroups([groupId])
  assert.equal(groups[0].state, 'Empty', JSON.stringify(groups[0]))
  assert.ok((await admin.listGroups()).groups.some(g => g.groupId === groupId), 'group not listed')
})

test('two kafkajs members share a topic; one leaves and the other resumes from its commits', { timeout: 180000 }, async () => {
  const topic = `${TOPIC}.group`
  await admin.createTopics({ topics: [{ topic, numPartitions: N_PARTITIONS, replicationFactor: 1 }], waitForLeaders: true })
  const groupId = `${topic}.sharers`
  const seen = new Map()
  const a = await startMember(groupId, topic, 'member-a', seen)
  const b = await startMember(groupId, topic, 'member-b', seen)
  let bOpen = true
  try {
    await waitFor(() => a.assigned.length > 0 && b.assigned.length > 0 &&
      new Set([...a.assigned, ...b.assigned]).size === N_PARTITIONS && a.assigned.length + b.assigned.length === N_PARTITIONS,
    `both members to share the partitions (a ${a.assigned}, b ${b.assigned})`)
    const sendRange = async (from, to) => {
      const messages = []
      for (let i = from; i < to; i++) messages.push(record(i))
      await producer.send({ topic, acks: -1, messages })
    }
    await sendRange(0, 3000)
    await waitFor(() => seen.size >= 3000, `3000 records (have ${seen.size})`)
    const who = new Set([...seen.values()].map(v => v[0].who))
    assert.deepEqual([...who].sort(), ['member-a', 'member-b'], 'both members consumed')

    await a.consumer.disconnect() // LeaveGroup
    await waitFor(() => b.assigned.length === N_PARTITIONS, `member-b to take over (has ${b.assigned})`)
    await sendRange(3000, 6000)
    await waitFor(() => seen.size >= 6000, `6000 records (have ${seen.size})`)
    await new Promise(r => setTimeout(r, 500)) // anything read twice shows up now
    for (const [at, v] of seen) assert.equal(v.length, 1, `${at} consumed twice: ${v.map(x => x.who)}`)
    assert.equal(seen.size, 6000)
    const { groups } = await admin.describeGroups([groupId])
    assert.equal(groups[0].state, 'Stable')
    assert.deepEqual(groups[0].members.map(m => m.clientId), ['compat-kafkajs'])
    await b.consumer.disconnect()
    bOpen = false
    const [committed] = await admin.fetchOffsets({ groupId, topics: [topic] })
    const ends = await admin.fetchTopicOffsets(topic)
    assert.deepEqual(committed.partitions.map(p => [p.partition, p.offset]).sort(), ends.map(o => [o.partition, o.high]).sort())
    await admin.deleteGroups([groupId])
    assert.ok(!(await admin.listGroups()).groups.some(g => g.groupId === groupId), 'deleted group still listed')
  } finally {
    await a.consumer.disconnect().catch(() => {})
    if (bOpen) await b.consumer.disconnect().catch(() => {})
  }
})

for (const [name, codec] of [['gzip', CompressionTypes.GZIP], ['snappy', CompressionTypes.Snappy], ['lz4', CompressionTypes.LZ4]]) {
  test(`${name}-compressed produce reads back intact through a group consumer`, { timeout: 120000 }, async () => {
    const topic = `${TOPIC}.${name}`
    await admin.createTopics({ topics: [{ topic, numPartitions: N_PARTITIONS, replicationFactor: 1 }], waitForLeaders: true })
    const messages = []
    for (let i = 0; i < 1000; i++) messages.push(record(i))
    for (let start = 0; start < messages.length; start += 250) {
      await producer.send({ topic, acks: -1, compression: codec, messages: messages.slice(start, start + 250) })
    }
    const seen = new Map()
    const member = await startMember(`${topic}.reader`, topic, `${name}-reader`, seen)
    try {
      await waitFor(() => seen.size >= 1000, `1000 records (have ${seen.size})`)
    } finally {
      await member.consumer.disconnect()
    }
    const keys = new Set()
    for (const [at, [first, ...again]] of seen) {
      assert.equal(again.length, 0, `${at} consumed twice`)
      const key = first.message.key.toString()
      const exp = record(Number(key.slice(2)))
      assert.equal(first.message.value.toString(), exp.value, `${at}: value`)
      keys.add(key)
    }
    assert.equal(keys.size, 1000)
  })
}

test('a transactional producer commits and aborts; read_committed consumers see only what committed', { timeout: 180000 }, async () => {
  const topic = `${TOPIC}.txn`
  const groupId = `${topic}.app`
  await admin.createTopics({ topics: [{ topic, numPartitions: N_PARTITIONS, replicationFactor: 1 }], waitForLeaders: true })
  const tp = kafka.producer({ transactionalId: `compat-${topic}`, idempotent: true, maxInFlightRequests: 1, createPartitioner: Partitioners.DefaultPartitioner })
  await tp.connect()
  try {
    for (const [outcome, offset] of [['commit', '5'], ['abort', '9']]) {
      const txn = await tp.transaction()
      const messages = []
      for (let i = 0; i < 30; i++) messages.push({ partition: i % N_PARTITIONS, value: `${outcome}-${i}` })
      await txn.send({ topic, acks: -1, messages })
      await txn.sendOffsets({ consumerGroupId: groupId, topics: [{ topic, partitions: [{ partition: 0, offset }] }] })
      if (outcome === 'commit') await txn.commit()
      else await txn.abort()
    }
  } finally {
    await tp.disconnect()
  }
  const offsets = await admin.fetchOffsets({ groupId, topics: [topic] })
  const p0 = offsets[0].partitions.find(p => p.partition === 0)
  assert.equal(p0.offset, '5', 'the committed transaction\'s offset, not the aborted one\'s')

  const seen = new Map()
  const member = await startMember(`${topic}.reader`, topic, 'txn-reader', seen) // kafkajs reads committed by default
  try {
    await waitFor(() => seen.size >= 30, `30 committed records (have ${seen.size})`)
    await new Promise(r => setTimeout(r, 1500))
  } finally {
    await member.consumer.disconnect()
  }
  const values = [...seen.values()].map(([first]) => first.message.value.toString()).sort()
  const want = Array.from({ length: 30 }, (_, i) => `commit-${i}`).sort()
  assert.deepEqual(values, want)
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

test('an ordered subtree stream (<prefix>.__all) through a kafkajs group consumer', { timeout: 120000 }, async () => {
  const prefix = `${TOPIC}-stream`
  const topics = [`${prefix}.a.x`, `${prefix}.b.y`, `${prefix}-outside`]
  const p = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner })
  await p.connect()
  const sent = []
  try {
    for (let i = 0; i < 60; i++) {
      const topic = topics[i % 3]
      const value = `${topic}#${i}`
      const [ack] = await p.send({ topic, acks: -1, messages: [{ value, partition: 0 }] })
      if (i % 3 !== 2) sent.push([topic, ack.partition, Number(ack.baseOffset), value])
    }
  } finally {
    await p.disconnect()
  }
  const stream = `${prefix}.__all`
  const groupId = `${prefix}.g`
  const consumer = kafka.consumer({ groupId, maxWaitTimeInMs: 200 })
  const got = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topic: stream, fromBeginning: true })
    await consumer.run({
      eachMessage: async ({ partition, message: m }) => {
        const h = Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k, v.toString()]))
        got.push({ partition, offset: m.offset, src: [h['canopy.topic'], Number(h['canopy.partition']), Number(h['canopy.offset']), m.value.toString()] })
      },
    })
    await waitFor(() => got.length >= sent.length, `${sent.length} stream records (have ${got.length})`)
  } finally {
    await consumer.disconnect()
  }
  assert.deepEqual(got.map(g => g.src), sent, 'the subtree in send order, tagged with its source')
  assert.ok(got.every(g => g.partition === 0))
  const offsets = got.map(g => BigInt(g.offset))
  offsets.forEach((o, i) => assert.ok(i === 0 || o > offsets[i - 1], `offsets increase at ${i}`))
  // kafkajs commits what it resolved: the last record's offset + 1, or the
  // end once it stepped past the control batch that closes a complete read.
  const [committed] = await admin.fetchOffsets({ groupId, topics: [stream] })
  const [{ high }] = await admin.fetchTopicOffsets(stream)
  const c = BigInt(committed.partitions[0].offset)
  assert.ok(c > offsets[offsets.length - 1] && c <= BigInt(high), `committed ${c}, last ${offsets[offsets.length - 1]}, end ${high}`)
})

// ---- security: SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER) and mutual TLS

const fs = require('node:fs')
const secured = how => {
  const env = process.env
  assert.ok(env.SASL_BOOTSTRAP && env.SSL_BOOTSTRAP && env.CA_PEM, 'the secured listeners are not set (run via tests/compat/run.sh)')
  const ca = [fs.readFileSync(env.CA_PEM, 'utf8')]
  const common = { clientId: `compat-kafkajs-${how}`, logLevel: logLevel.NOTHING, connectionTimeout: 10000, requestTimeout: 30000, retry: { retries: 2 } }
  if (how === 'ssl-cert') {
    return new Kafka({ ...common, brokers: [env.SSL_BOOTSTRAP], ssl: { ca, cert: fs.readFileSync(env.CLIENT_CERT, 'utf8'), key: fs.readFileSync(env.CLIENT_KEY, 'utf8') } })
  }
  if (how === 'oauthbearer') {
    return new Kafka({ ...common, brokers: [env.SASL_BOOTSTRAP], ssl: { ca }, sasl: { mechanism: how, oauthBearerProvider: async () => ({ value: jwt(env.SASL_USER) }) } })
  }
  return new Kafka({ ...common, brokers: [env.SASL_BOOTSTRAP], ssl: { ca }, sasl: { mechanism: how, username: env.SASL_USER, password: how === 'wrong' ? 'not-it' : env.SASL_PASSWORD } })
}

// An RS256 token for `sub`, signed with the compat identity provider's key
// (run.sh puts its public half in the broker's JWKS).
const jwt = sub => {
  const crypto = require('node:crypto')
  const b64 = b => Buffer.from(b).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  const input = `${b64(JSON.stringify({ alg: 'RS256', typ: 'JWT', kid: process.env.IDP_KID }))}.${b64(JSON.stringify({ sub, aud: process.env.IDP_AUDIENCE, iat: now, exp: now + 3600 }))}`
  return `${input}.${b64(crypto.sign('sha256', Buffer.from(input), fs.readFileSync(process.env.IDP_KEY, 'utf8')))}`
}

for (const how of ['scram-sha-512', 'scram-sha-256', 'plain', 'oauthbearer', 'ssl-cert']) {
  test(`over ${how}: produce, consume in a group and commit`, { timeout: 120000 }, async () => {
    const client = secured(how)
    const topic = `compat.kafkajs_secure_${how.replace(/-/g, '_')}.${Date.now()}`
    const values = Array.from({ length: 300 }, (_, i) => `secure-${String(i).padStart(4, '0')}`)
    const p = client.producer({ createPartitioner: Partitioners.DefaultPartitioner, allowAutoTopicCreation: true })
    await p.connect()
    try {
      for (let i = 0; i < values.length; i += 100) {
        await p.send({ topic, acks: -1, messages: values.slice(i, i + 100).map(value => ({ value })) })
      }
    } finally {
      await p.disconnect()
    }
    const groupId = `${topic}.g`
    const got = []
    const c = client.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 500, maxWaitTimeInMs: 100 })
    await c.connect()
    try {
      await c.subscribe({ topic, fromBeginning: true })
      await c.run({ eachMessage: async ({ message }) => { got.push(message.value.toString()) } })
      await waitFor(() => got.length >= values.length, `${values.length} records over ${how} (have ${got.length})`)
    } finally {
      await c.disconnect()
    }
    assert.deepEqual(got.slice().sort(), values)
    const a = client.admin()
    await a.connect()
    try {
      const [committed] = await a.fetchOffsets({ groupId, topics: [topic] })
      assert.equal(committed.partitions.reduce((n, p) => n + Math.max(Number(p.offset), 0), 0), values.length)
    } finally {
      await a.disconnect()
    }
  })
}

test('a wrong password fails with SASL_AUTHENTICATION_FAILED', { timeout: 60000 }, async () => {
  const wrong = new Kafka({ clientId: 'compat-kafkajs-wrong', logLevel: logLevel.NOTHING, brokers: [process.env.SASL_BOOTSTRAP], ssl: { ca: [fs.readFileSync(process.env.CA_PEM, 'utf8')] }, sasl: { mechanism: 'scram-sha-512', username: process.env.SASL_USER, password: 'not-it' }, retry: { retries: 0 } })
  const p = wrong.producer()
  await assert.rejects(p.connect(), e => /SASL SCRAM SHA512 authentication failed|invalid credentials/i.test(`${e.message} ${e.cause || ''}`) || e.type === 'SASL_AUTHENTICATION_FAILED', 'expected an authentication failure')
})
