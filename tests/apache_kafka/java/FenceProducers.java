// KIP-618's zombie fencing as Kafka Connect's leader does it before a source connector's new
// task generation starts: Admin.fenceProducers on transactional ids (an InitProducerId each).
// Run in Java's source-file mode: java -cp 'mirror-maker-libs/*' FenceProducers.java BOOTSTRAP ID...

import java.util.Arrays;
import java.util.Map;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.FenceProducersResult;

public class FenceProducers {
    public static void main(String[] args) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", args[0]))) {
            FenceProducersResult result =
                admin.fenceProducers(Arrays.asList(args).subList(1, args.length));
            result.all().get();
            for (String id : Arrays.asList(args).subList(1, args.length)) {
                System.out.println(
                    id + " " + result.producerId(id).get() + " " + result.epochId(id).get());
            }
        }
    }
}
