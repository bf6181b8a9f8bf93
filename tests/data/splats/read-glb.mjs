// Reads a .glb with glTF-Transform and validates it with Khronos's glTF-Validator; prints JSON.
import { readFileSync } from 'node:fs';
import { NodeIO } from '@gltf-transform/core';
import validator from 'gltf-validator';
const path = process.argv[2];
const data = new Uint8Array(readFileSync(path));
const report = await validator.validateBytes(data);
const doc = await new NodeIO().readBinary(data);
const prim = doc.getRoot().listMeshes()[0].listPrimitives()[0];
const attributes = {};
for (const semantic of prim.listSemantics()) attributes[semantic] = Array.from(prim.getAttribute(semantic).getArray());
console.log(JSON.stringify({ validator: report.validatorVersion, issues: report.issues, mode: prim.getMode(), attributes }));
