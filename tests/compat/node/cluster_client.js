// kafkajs against a Canopy cluster (run by the cluster harness,
// tests/it/cluster/clients.rs, not by `node --test`).
//
//     node cluster_client.js BOOTSTRAP TOPIC COUNT GROUP
//
// Bootstrapping from the one broker it is given, it produces COUNT records
// (keys and values `js<i>`) with an idempotent producer and acks=-1, reads
// them back in consumer group GROUP from the beginning, commits each
// record's next offset, and reads the group's offsets back (admin
// fetchOffsets). Prints one JSON line: every record's [partition, offset]
// as acknowledged and as read, and the committed offsets. Exits non-zero on
// any failure.
'use strict'

const { Kafka, Partitioners, logLevel } = require('kafkajs')

async function main () {
  const [boot, topic, countArg, groupId] = process.argv.slice(2)
  const count = Number(countArg)
  const kafka = new Kafka({ clientId: 'canopy-cluster-js', brokers: [boot], logLevel: logLevel.NOTHING, retry: { retries: 20 } })

  const admin = kafka.admin()
  await admin.connect()
  const meta = await admin.fetchTopicMetadata({ topics: [topic] })
  const partitions = meta.topics[0].partitions.length
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, createPartitioner: Partitioners.DefaultPartitioner })
  await producer.connect()
  // Record i goes to partition i % partitions; each send is one batch to
  // one partition, so its ack's base offset gives every record's offset.
  const acked = {}
  for (let start = 0; start < count; start += 50 * partitions) {
    for (let p = 0; p < partitions; p++) {
      const values = []
      for (let i = start + p; i < Math.min(start + 50 * partitions, count); i += partitions) values.push(`js${i}`)
      if (values.length === 0) continue
      const [r] = await producer.send({ topic, acks: -1, messages: values.map(v => ({ key: v, value: v, partition: p })) })
      values.forEach((v, k) => { acked[v] = [r.partition, Number(r.baseOffset) + k] })
    }
  }
  await producer.disconnect()

  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000 })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  const read = {}
  let resolve
  const done = new Promise(r => { resolve = r })
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      const v = message.value.toString()
      if (!v.startsWith('js')) return
      read[v] = [partition, Number(message.offset)]
      await consumer.commitOffsets([{ topic, partition, offset: (BigInt(message.offset) + 1n).toString() }])
      if (Object.keys(read).length >= count) resolve()
    },
  })
  const timer = setTimeout(() => { console.error(`read ${Object.keys(read).length} of ${count} records in 90 s`); process.exit(1) }, 90000)
  await done
  clearTimeout(timer)
  await consumer.disconnect()

  const offsets = await admin.fetchOffsets({ groupId, topics: [topic] })
  await admin.disconnect()
  const committed = {}
  for (const p of offsets[0].partitions) committed[String(p.partition)] = Number(p.offset)
  console.log(JSON.stringify({ acked, read, committed }))
}

main().catch(e => { console.error(e); process.exit(1) })
