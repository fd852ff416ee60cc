// KafkaJS transactions for pykbroker's integration tests (tests/integration/test_transactions_clients.py).
//
// Usage: node txn_client.js '{"brokers": ["127.0.0.1:9092"], "topic": "t", "transactionalId": "tid",
//                            "offsetsTopic": "in", "offsetsGroup": "g", "readerGroup": "r",
//                            "quietMs": 3000, "timeoutMs": 60000}'
//
// A transactional producer commits js-commit-0..3 (partitions 0,1,0,1) with the offset 4 of offsetsTopic-0 for
// offsetsGroup (sendOffsets), then aborts js-abort-0..1 with the offset 6; a readUncommitted:false consumer
// (group readerGroup, from the beginning) reads until it has 4 records and quietMs passed with nothing more.
// Prints one JSON line {"read": [values]} and exits 0; any error: message on stderr, exit 1.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const options = JSON.parse(process.argv[2])
const kafka = new Kafka({ clientId: 'txn-client', brokers: options.brokers, logLevel: logLevel.ERROR })

const offsets = (offset) => ({
  consumerGroupId: options.offsetsGroup,
  topics: [{ topic: options.offsetsTopic, partitions: [{ partition: 0, offset: String(offset) }] }],
})

const produce = async () => {
  const producer = kafka.producer({ transactionalId: options.transactionalId, idempotent: true,
    maxInFlightRequests: 1 })
  await producer.connect()
  try {
    const committed = await producer.transaction()
    await committed.send({ topic: options.topic,
      messages: [0, 1, 2, 3].map((i) => ({ value: `js-commit-${i}`, partition: i % 2 })) })
    await committed.sendOffsets(offsets(4))
    await committed.commit()

    const aborted = await producer.transaction()
    await aborted.send({ topic: options.topic,
      messages: [0, 1].map((i) => ({ value: `js-abort-${i}`, partition: i % 2 })) })
    await aborted.sendOffsets(offsets(6))
    await aborted.abort()
  } finally {
    await producer.disconnect()
  }
}

const read = async () => {
  const consumer = kafka.consumer({ groupId: options.readerGroup, readUncommitted: false, maxWaitTimeInMs: 100 })
  const values = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [options.topic], fromBeginning: true })
    let lastAt = Date.now()
    await consumer.run({ eachMessage: async ({ message }) => { values.push(message.value.toString()); lastAt = Date.now() } })
    const deadline = Date.now() + options.timeoutMs
    while (Date.now() < deadline && !(values.length >= 4 && Date.now() - lastAt >= options.quietMs)) {
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  } finally {
    await consumer.disconnect()
  }
  return values
}

const main = async () => {
  await produce()
  const values = await read()
  process.stdout.write(JSON.stringify({ read: values }) + '\n')
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`${error && error.stack ? error.stack : error}\n`)
  process.exit(1)
})
