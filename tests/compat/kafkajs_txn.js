// kafkajs's transactions against oncelog, one role per run. Run by tests/compat/test_transactions.py
// (through tests/compat/txn_clients.py), which judges the coordinator's side (states, markers,
// offsets) from the broker and compares what the read role saw with what was committed.
//
// usage: node kafkajs_txn.js <bootstrap[,bootstrap...]> <role> <topic> <transactional id or group> [args...]
//   commit-abort <topic> <tid> <aborted json> <committed json>
//       one transaction with the aborted [[partition, value], ...] records, aborted, then one with
//       the committed ones, committed
//   fence <topic> <tid>
//       a first producer opens a transaction and sends "zombie" to partition 0; a second one with
//       the same id starts (fencing the first), the first tries to commit (its error is printed),
//       the second commits "new" to partition 0
//   read <topic> <group> <count>
//       a consumer (readUncommitted false: read_committed, kafkajs's default) reads from the start
//       until it has <count> records or a deadline passes; prints them as [partition, value]
//   send-offsets <topic> <tid> <group> <offset>
//       a committed transaction with one record and sendOffsets(group, partition 0 at offset)

'use strict'

const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, role, ...args] = process.argv.slice(2)
// SASL_SSL when $ONCELOG_KAFKAJS_SASL_SSL is {"ca": <pem file>, "mechanism", "username", "password"}
// (the environment, not the command line: it is the owner's alone)
const secure = process.env.ONCELOG_KAFKAJS_SASL_SSL && JSON.parse(process.env.ONCELOG_KAFKAJS_SASL_SSL)
const security = secure ? { ssl: { ca: [fs.readFileSync(secure.ca, 'utf-8')] },
  sasl: { mechanism: secure.mechanism, username: secure.username, password: secure.password } } : {}
const kafka = new Kafka({ clientId: 'oncelog-compat-txn', brokers: bootstrap.split(','), logLevel: logLevel.NOTHING,
  retry: { retries: 8, initialRetryTime: 100 }, ...security })
const DEADLINE_MS = 60000

const txnProducer = (transactionalId) =>
  kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })

const toMessages = (pairs) => pairs.map(([partition, value]) => ({ partition, value }))

async function commitAbort(topic, transactionalId, aborted, committed) {
  const producer = txnProducer(transactionalId)
  await producer.connect()
  let txn = await producer.transaction()
  await txn.send({ topic, messages: toMessages(JSON.parse(aborted)) })
  await txn.abort()
  txn = await producer.transaction()
  await txn.send({ topic, messages: toMessages(JSON.parse(committed)) })
  await txn.commit()
  await producer.disconnect()
  return {}
}

async function fence(topic, transactionalId) {
  const first = txnProducer(transactionalId)
  await first.connect()
  const zombie = await first.transaction()
  await zombie.send({ topic, messages: [{ partition: 0, value: 'zombie' }] })
  const second = txnProducer(transactionalId)
  await second.connect()
  const txn = await second.transaction()  // InitProducerId: fences the first and aborts its transaction
  let fenced = null
  try {
    await zombie.commit()
  } catch (e) {
    fenced = { name: e.name, type: e.type || null, retriable: e.retriable === true }
  }
  await txn.send({ topic, messages: [{ partition: 0, value: 'new' }] })
  await txn.commit()
  await second.disconnect()
  await first.disconnect().catch(() => {})
  return { fenced }
}

async function read(topic, groupId, count) {
  const consumer = kafka.consumer({ groupId, readUncommitted: false, maxWaitTimeInMs: 100 })
  const got = []
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  await consumer.run({ eachMessage: async ({ partition, message }) => {
    got.push([partition, message.value.toString()])
  } })
  const end = Date.now() + DEADLINE_MS
  while (got.length < Number(count) && Date.now() < end) await new Promise(r => setTimeout(r, 50))
  await consumer.disconnect()
  return { records: got }
}

async function sendOffsets(topic, transactionalId, consumerGroupId, offset) {
  const producer = txnProducer(transactionalId)
  await producer.connect()
  const txn = await producer.transaction()
  await txn.send({ topic, messages: [{ partition: 1, value: 'with-offsets' }] })
  await txn.sendOffsets({ consumerGroupId, topics: [{ topic, partitions: [{ partition: 0, offset }] }] })
  await txn.commit()
  await producer.disconnect()
  return {}
}

const roles = { 'commit-abort': commitAbort, fence, read, 'send-offsets': sendOffsets }

roles[role](...args).then((out) => console.log(JSON.stringify({ failure: null, ...out })),
  (e) => console.log(JSON.stringify({ failure: `${e.name}: ${e.message}` })))
