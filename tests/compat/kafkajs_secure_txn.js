// kafkajs's transactions over SASL_SSL against a cluster of oncelog brokers. Run by
// tests/compat/test_secure_cluster.py, which judges what was read against what was committed.
//
// usage: node kafkajs_secure_txn.js <bootstrap> <ca.pem> <mechanism> <user> <password> <role> <topic> [args...]
//   commit-abort <topic> <tid> <aborted json> <committed json>
//       one transaction with the aborted [[partition, value], ...] records, aborted, then one with
//       the committed ones, committed
//   read <topic> <group> <count>
//       a read_committed consumer (kafkajs's default) reads from the start until it has <count>
//       records or a deadline passes; prints them as [partition, value]

'use strict'

const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, ca, mechanism, username, password, role, topic, ...args] = process.argv.slice(2)
const kafka = new Kafka({ clientId: 'oncelog-secure-txn', brokers: bootstrap.split(','), logLevel: logLevel.NOTHING,
  ssl: { ca: [fs.readFileSync(ca, 'utf-8')] }, sasl: { mechanism, username, password },
  retry: { retries: 8, initialRetryTime: 100 } })
const DEADLINE_MS = 60000

const toMessages = (pairs) => JSON.parse(pairs).map(([partition, value]) => ({ partition, value }))

async function commitAbort(transactionalId, aborted, committed) {
  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  let txn = await producer.transaction()
  await txn.send({ topic, messages: toMessages(aborted) })
  await txn.abort()
  txn = await producer.transaction()
  await txn.send({ topic, messages: toMessages(committed) })
  await txn.commit()
  await producer.disconnect()
  return {}
}

async function read(groupId, count) {
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

const roles = { 'commit-abort': commitAbort, read }
roles[role](...args)
  .then(out => console.log(JSON.stringify({ ...out, errors: [] })))
  .catch(e => { console.log(JSON.stringify({ failure: `${e.name}: ${e.message}`, errors: [] })); process.exitCode = 0 })
