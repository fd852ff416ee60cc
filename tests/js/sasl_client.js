// KafkaJS over a SASL listener, for pykbroker's integration tests (tests/integration/test_sasl_listeners.py).
//
// Usage: node sasl_client.js '{"brokers": ["127.0.0.1:9094"], "topic": "t", "count": 5,
//                             "sasl": {"mechanism": "plain", "username": "alice", "password": "..."},
//                             (or {"mechanism": "oauthbearer", "token": "an unsecured JWS"}),
//                             "ssl": {"ca": "PEM text"} | false, "timeoutMs": 60000}'
//
// A producer sends js-0..count-1 to topic; a consumer (a new group, from the beginning) reads them back.
// Prints one JSON line {"read": [values]} and exits 0; any error: its message on stderr, exit 1.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const options = JSON.parse(process.argv[2])
const sasl = options.sasl.mechanism === 'oauthbearer'
  ? { mechanism: 'oauthbearer', oauthBearerProvider: async () => ({ value: options.sasl.token }) }
  : options.sasl
const kafka = new Kafka({ clientId: 'sasl-client', brokers: options.brokers, logLevel: logLevel.ERROR,
  sasl, ssl: options.ssl || false, connectionTimeout: 10000, retry: { retries: 3 } })

const main = async () => {
  const producer = kafka.producer()
  await producer.connect()
  const messages = []
  for (let i = 0; i < options.count; i++) messages.push({ value: `js-${i}` })
  await producer.send({ topic: options.topic, messages })
  await producer.disconnect()
  const consumer = kafka.consumer({ groupId: `sasl-js-${Date.now()}-${Math.random()}` })
  await consumer.connect()
  await consumer.subscribe({ topic: options.topic, fromBeginning: true })
  const read = []
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`read ${read.length} of ${options.count}`)), options.timeoutMs)
    consumer.run({ eachMessage: async ({ message }) => {
      read.push(message.value.toString())
      if (read.length >= options.count) { clearTimeout(timer); resolve() }
    } }).catch(reject)
  })
  await consumer.disconnect()
  console.log(JSON.stringify({ read }))
}

main().then(() => process.exit(0), (error) => { console.error(error && error.stack || String(error)); process.exit(1) })
