/** This SDK's version, sent on every call (the server's version gate compares it with the
 * keyspace's minimum SDK version); test/package.test.ts checks it equals package.json's. */
export const SDK_VERSION = "0.1.0";
