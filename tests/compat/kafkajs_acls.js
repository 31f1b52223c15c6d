// kafkajs against oncelog's authorizer: one action as an authenticated principal, reporting the
// protocol error kafkajs raised (its `type`, Kafka's error name) or success. Run by
// tests/compat/test_security_acls.py.
//
// usage: node kafkajs_acls.js <action> <topic> <group | transactional id | -> <bootstrap> <ca.pem>
//                             <sasl <mechanism> <user> <password> | mtls <cert> <key>>
//   action: produce | consume | transact

'use strict'

const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')

const [action, topic, name, bootstrap, ca, mode, a, b, c] = process.argv.slice(2)
const ssl = { ca: [fs.readFileSync(ca, 'utf-8')] }
let sasl
if (mode === 'mtls') {
  ssl.cert = fs.readFileSync(a, 'utf-8')
  ssl.key = fs.readFileSync(b, 'utf-8')
} else {
  sasl = { mechanism: a, username: b, password: c }
}
// no retries: an authorization error is final, and a retry would only hide which request refused
const kafka = new Kafka({ clientId: 'oncelog-acls', brokers: [bootstrap], ssl, sasl, logLevel: logLevel.NOTHING,
  connectionTimeout: 5000, retry: { retries: 0 } })

// kafkajs wraps a protocol error in retry and crash errors; the innermost type is Kafka's name.
// A refused FindCoordinator has none: kafkajs drops its error and reports
// KafkaJSGroupCoordinatorNotFound (BrokerPool.withBroker swallows it), against Kafka too.
function errorType (e) {
  for (let x = e; x; x = x.originalError || x.cause) {
    if (x.type) return x.type
  }
  return e.name
}

async function produce () {
  const producer = kafka.producer()
  await producer.connect()
  try {
    await producer.send({ topic, messages: [{ value: 'kafkajs' }] })
  } finally {
    await producer.disconnect()
  }
}

async function consume () {
  const consumer = kafka.consumer({ groupId: name, retry: { retries: 0 } })
  await consumer.connect()
  try {
    await consumer.subscribe({ topic, fromBeginning: true })
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no record and no error within 30 s')), 30000)
      consumer.on(consumer.events.CRASH, ({ payload }) => { clearTimeout(timer); reject(payload.error) })
      consumer.run({ eachMessage: async () => { clearTimeout(timer); resolve() } }).catch(reject)
    })
  } finally {
    await consumer.disconnect()
  }
}

async function transact () {
  // an idempotent producer must retry; authorization errors are not retriable anyway
  const producer = kafka.producer({ transactionalId: name, idempotent: true, maxInFlightRequests: 1,
    retry: { retries: 1, initialRetryTime: 100 } })
  await producer.connect()
  try {
    const txn = await producer.transaction()
    await txn.send({ topic, messages: [{ value: 'kafkajs in a transaction' }] })
    await txn.commit()
  } finally {
    await producer.disconnect()
  }
}

const actions = { produce, consume, transact }

actions[action]()
  .then(() => console.log(JSON.stringify({ ok: true })))
  .catch(e => console.log(JSON.stringify({ ok: false, type: errorType(e), error: `${e.name}: ${e.message}` })))
