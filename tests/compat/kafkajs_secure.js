// kafkajs over TLS and SASL against oncelog: produce one record and read it back, or (mode
// "refused") expect the connection to be refused. Run by tests/compat/test_security_clients.py.
//
// usage: node kafkajs_secure.js <bootstrap> <topic> <ca.pem> <mode> [<mechanism> <user> <password> | <cert> <key>]
//   mode: sasl | mtls | refused

'use strict'

const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, topic, ca, mode, a, b, c] = process.argv.slice(2)
const ssl = { ca: [fs.readFileSync(ca, 'utf-8')] }
let sasl
if (mode === 'mtls') {
  ssl.cert = fs.readFileSync(a, 'utf-8')
  ssl.key = fs.readFileSync(b, 'utf-8')
} else {
  sasl = { mechanism: a, username: b, password: c }
}
const kafka = new Kafka({ clientId: 'oncelog-secure', brokers: [bootstrap], ssl, sasl, logLevel: logLevel.NOTHING,
  connectionTimeout: 5000, retry: { retries: mode === 'refused' ? 0 : 5, initialRetryTime: 100 } })

async function main () {
  const out = {}
  const producer = kafka.producer()
  try {
    await producer.connect()
    await producer.send({ topic, messages: [{ key: 'k', value: `kafkajs-${mode}` }] })
    await producer.disconnect()
    out.produced = true
  } catch (e) {
    out.produced = false
    out.error = `${e.name}: ${e.message}`
    if (e.type) out.type = e.type
    console.log(JSON.stringify(out))
    return
  }
  const consumer = kafka.consumer({ groupId: `${topic}-group` })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  out.values = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no record within 30 s')), 30000)
    consumer.run({ eachMessage: async ({ message }) => { clearTimeout(timer); resolve([message.value.toString()]) } })
  })
  await consumer.disconnect()
  console.log(JSON.stringify(out))
}

main().catch(e => { console.log(JSON.stringify({ failure: `${e.name}: ${e.message}` })); process.exit(0) })
