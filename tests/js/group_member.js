// One KafkaJS consumer-group member for pykbroker's integration tests (tests/integration/test_groups_kafkajs.py).
//
// Usage: node group_member.js '{"brokers": ["127.0.0.1:9092"], "groupId": "g", "topic": "t", "clientId": "a",
//                              "sessionTimeout": 4000, "heartbeatInterval": 300, "commitEach": false}'
//
// Subscribes from the beginning, with auto-commit or (commitEach) a commit after each message, and reports
// on stdout, one JSON object per line:
//   {"assigned": [partitions]}                   after each JoinGroup/SyncGroup (the whole assignment)
//   {"read": [partition, offset, value]}         each message, before it is committed
//   {"committed": [[partition, next offset]...]} each successful OffsetCommit
//   {"error": "..."}                             a crash of the consumer
// SIGTERM disconnects cleanly (commit, LeaveGroup) and exits 0; SIGKILL is a member that dies.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const options = JSON.parse(process.argv[2])
const report = (event) => process.stdout.write(JSON.stringify(event) + '\n')

const kafka = new Kafka({ clientId: options.clientId, brokers: options.brokers, logLevel: logLevel.NOTHING })
const consumer = kafka.consumer({
  groupId: options.groupId,
  sessionTimeout: options.sessionTimeout,
  heartbeatInterval: options.heartbeatInterval,
  // KafkaJS heartbeats between fetches: a fetch must not wait longer than the session allows.
  maxWaitTimeInMs: 250,
})

consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
  report({ assigned: (payload.memberAssignment[options.topic] || []).slice().sort((a, b) => a - b) })
})
consumer.on(consumer.events.COMMIT_OFFSETS, ({ payload }) => {
  const committed = []
  for (const topic of payload.topics) {
    for (const p of topic.partitions) committed.push([Number(p.partition), Number(p.offset)])
  }
  report({ committed })
})
consumer.on(consumer.events.CRASH, ({ payload }) => report({ error: String(payload.error) }))

let stopping = false
process.on('SIGTERM', async () => {
  if (stopping) return
  stopping = true
  try {
    await consumer.disconnect()
  } finally {
    process.exit(0)
  }
})

const main = async () => {
  await consumer.connect()
  await consumer.subscribe({ topics: [options.topic], fromBeginning: true })
  await consumer.run({
    autoCommit: !options.commitEach,
    eachMessage: async ({ topic, partition, message }) => {
      report({ read: [partition, Number(message.offset), message.value.toString()] })
      if (options.commitEach) {
        const next = String(Number(message.offset) + 1)
        // A failed commit (the group is rebalancing) leaves the message uncommitted; COMMIT_OFFSETS
        // reports only the ones that succeed.
        await consumer.commitOffsets([{ topic, partition, offset: next }]).catch(() => {})
      }
    },
  })
}

main().catch((error) => {
  report({ error: String(error) })
  process.exit(1)
})
