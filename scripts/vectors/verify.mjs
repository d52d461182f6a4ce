// The providers' own Node.js verifiers, for scripts/vectors/generate.py: reads
// {preset, secret, url, headers: [[name, value]...], body (base64)} on stdin and
// prints "ok" when the provider's library accepts the delivery (anything else
// is the library's refusal).
import '@shopify/shopify-api/adapters/web-api';
import { shopifyApi, ApiVersion } from '@shopify/shopify-api';
import { LinearWebhooks } from '@linear/sdk';
import Mux from '@mux/mux-node';
import { verifyWebhook } from '@clerk/backend/webhooks';
import { Resend } from 'resend';

const input = JSON.parse(await new Promise((resolve) => {
  let text = '';
  process.stdin.on('data', (c) => { text += c; });
  process.stdin.on('end', () => resolve(text));
}));
const body = Buffer.from(input.body, 'base64');
const headers = new Headers(input.headers);
const url = input.url ?? 'https://hooks.example.com/webhooks/' + input.preset;

async function verify() {
  switch (input.preset) {
    case 'shopify': {
      const shopify = shopifyApi({
        apiKey: 'test-api-key', apiSecretKey: input.secret, hostName: 'hooks.example.com',
        apiVersion: ApiVersion.October25 ?? Object.values(ApiVersion).at(-2), isEmbeddedApp: false,
        logger: { level: 0 },
      });
      const rawRequest = new Request(url, { method: 'POST', headers, body });
      const result = await shopify.webhooks.validate({ rawBody: body.toString('utf8'), rawRequest });
      return result.valid ? 'ok' : JSON.stringify(result);
    }
    case 'linear':
      return new LinearWebhooks(input.secret).verify(body, headers.get('linear-signature')) ? 'ok' : 'refused';
    case 'mux': {
      const mux = new Mux({ tokenId: 'x', tokenSecret: 'y', webhookSecret: input.secret });
      await mux.webhooks.verifySignature(body.toString('utf8'), Object.fromEntries(headers.entries()));
      return 'ok';
    }
    case 'clerk': {
      const rawRequest = new Request(url, { method: 'POST', headers, body });
      await verifyWebhook(rawRequest, { signingSecret: input.secret });
      return 'ok';
    }
    case 'resend': {
      new Resend('re_test_key').webhooks.verify({
        payload: body.toString('utf8'),
        headers: { id: headers.get('svix-id'), timestamp: headers.get('svix-timestamp'), signature: headers.get('svix-signature') },
        webhookSecret: input.secret,
      });
      return 'ok';
    }
    default:
      return 'no Node verifier for ' + input.preset;
  }
}

try {
  console.log(await verify());
} catch (e) {
  console.log('refused: ' + (e && e.message));
}
