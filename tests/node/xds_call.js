// A grpc-js-xds client (npm, unchanged) making calls to an xds:/// target through meshd:
// `node xds_call.js TARGET CALLS PATIENCE_SECONDS`, with GRPC_XDS_BOOTSTRAP naming the
// bootstrap. Prints the answers (raw bytes as text) as a JSON list; exits non-zero when the
// calls do not get through within the patience.
'use strict';
const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');

const [target, calls, patience] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
xds.register();
const client = new grpc.Client(target, grpc.credentials.createInsecure());
const identity = (b) => b;
const deadline = Date.now() + patience * 1000;

function call() {
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest('/test.Echo/Call', identity, identity, Buffer.from('hi'),
      { deadline: Date.now() + 10000 }, (err, reply) => (err ? reject(err) : resolve(reply.toString())));
  });
}

(async () => {
  const answers = [];
  while (answers.length < calls) {
    try {
      answers.push(await call());
    } catch (err) {
      if (Date.now() > deadline) {
        console.error(`no answer within ${patience}s: ${err.code} ${err.details}`);
        process.exit(1);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  console.log(JSON.stringify(answers));
  client.close();
  process.exit(0);
})();
