// kafkajs moving a partition of a Canopy cluster (run by the cluster
// harness, tests/it/cluster/reassign.rs, not by `node --test`).
//
//     node reassign.js BOOTSTRAP TOPIC PARTITION REPLICAS
//
// REPLICAS is a comma-separated list of broker ids. Bootstrapping from the
// one broker it is given, it asks the move with admin
// alterPartitionReassignments, then lists the reassignments under way
// (admin listPartitionReassignments) every 100 ms until the partition is
// no longer listed (at most 60 s). Prints one JSON line: what each listing
// said of the partition while it moved ({replicas, addingReplicas,
// removingReplicas}), and how many listings there were. Exits non-zero on
// any failure.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

async function main () {
  const [boot, topic, partitionArg, replicasArg] = process.argv.slice(2)
  const partition = Number(partitionArg)
  const replicas = replicasArg.split(',').map(Number)
  const kafka = new Kafka({ clientId: 'canopy-reassign-js', brokers: [boot], logLevel: logLevel.NOTHING, retry: { retries: 10 } })
  const admin = kafka.admin()
  await admin.connect()
  await admin.alterPartitionReassignments({ topics: [{ topic, partitionAssignment: [{ partition, replicas }] }], timeout: 30000 })
  const seen = []
  let listings = 0
  const deadline = Date.now() + 60000
  for (;;) {
    const { topics } = await admin.listPartitionReassignments({ topics: [{ topic, partitions: [partition] }], timeout: 30000 })
    listings++
    const mine = topics.filter(t => t.name === topic).flatMap(t => t.partitions).filter(p => p.partition === partition)
    if (mine.length === 0) break
    for (const p of mine) seen.push({ replicas: p.replicas, addingReplicas: p.addingReplicas, removingReplicas: p.removingReplicas })
    if (Date.now() > deadline) {
      console.error(`still moving after 60 s: ${JSON.stringify(seen[seen.length - 1])}`)
      process.exit(1)
    }
    await new Promise(r => setTimeout(r, 100))
  }
  await admin.disconnect()
  console.log(JSON.stringify({ seen, listings }))
}

main().catch(e => { console.error(e); process.exit(1) })
