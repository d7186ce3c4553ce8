// A classic group's record value (GroupMetadataValue) as Apache Kafka's generated class writes
// it, in every version (0-4): one line per version, "VERSION HEX", the bytes with their int16
// version prefix as they are stored in __consumer_offsets.
// Run in Java's source-file mode: java -cp 'libs/*' GroupMetadataBytes.java

import java.util.HexFormat;
import java.util.List;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.coordinator.group.generated.GroupMetadataValue;

public class GroupMetadataBytes {
    public static void main(String[] args) {
        GroupMetadataValue value = new GroupMetadataValue()
            .setProtocolType("consumer")
            .setGeneration(7)
            .setProtocol("range")
            .setLeader("a-1")
            .setCurrentStateTimestamp(1_700_000_000_123L)
            .setMembers(List.of(
                new GroupMetadataValue.MemberMetadata()
                    .setMemberId("a-1").setGroupInstanceId(null)
                    .setClientId("cli").setClientHost("/127.0.0.1")
                    .setRebalanceTimeout(300_000).setSessionTimeout(45_000)
                    .setSubscription("sub".getBytes()).setAssignment("asg".getBytes()),
                new GroupMetadataValue.MemberMetadata()
                    .setMemberId("i-1").setGroupInstanceId("inst")
                    .setClientId("cli2").setClientHost("/::1")
                    .setRebalanceTimeout(60_000).setSessionTimeout(10_000)
                    .setSubscription(new byte[0]).setAssignment(new byte[] {0, 1})));
        for (short version = 0; version <= 4; version++) {
            byte[] bytes = MessageUtil.toVersionPrefixedBytes(version, value);
            System.out.println(version + " " + HexFormat.of().formatHex(bytes));
        }
    }
}
